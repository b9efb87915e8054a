// Keeps a page's live regions up to date (alwayson/web/live.py, docs/explanation/live-pages.md).
// A region names its poll URL, the cursor it shows and, when the server can push, its stream:
//   <div id="conversation" data-live-poll="…/live/" data-live-cursor="12.3.0" data-live-stream="…/stream/">
// Pushed: an EventSource; the browser reconnects by itself and says the last cursor it saw
// (Last-Event-ID), and the server sends what changed since: the whole region, or a "patch"
// event with the entries rendered since the page's revision and the order of them all (a
// conversation: alwayson/web/feed.py). When the stream cannot come back
// by itself (a proxy's 502 while the server restarts), one poll catches up and the stream opens
// again, later each time. Without a stream: a poll a second, which costs the server one query
// while nothing changes. A 403/404 (the role is gone) or a redirect to the login page ends it.
(function () {
  "use strict";
  var POLL_MS = 1000;
  var MAX_RETRY_MS = 30000;

  // What a person is doing in a region survives its update: a field they changed keeps what
  // they typed or chose, an opened <details> stays open (and the focus stays, in swap).
  function carryOver(current, fresh) {
    function twin(element) {
      return fresh.querySelector("#" + CSS.escape(element.id));
    }
    current.querySelectorAll("details[id]").forEach(function (old) {
      var now = twin(old);
      if (now) now.open = old.open;
    });
    current.querySelectorAll("input[id], textarea[id], select[id]").forEach(function (old) {
      var now = twin(old);
      if (!now || old.type === "hidden") return;
      if (old.type === "radio" || old.type === "checkbox") {
        if (old.checked !== old.defaultChecked) now.checked = old.checked;
      } else if (old.tagName === "SELECT") {
        var changed = Array.prototype.some.call(old.options, function (o) { return o.selected !== o.defaultSelected; });
        if (changed) now.value = old.value;
      } else if (old.value !== old.defaultValue) {
        now.value = old.value;
      }
    });
  }

  function keepLive(id) {
    var region = document.getElementById(id);
    var poll = region.dataset.livePoll;
    var stream = region.dataset.liveStream;

    function cursor() {
      var current = document.getElementById(id);
      return current ? current.dataset.liveCursor || "" : "";
    }

    function swap(html) {
      var current = document.getElementById(id);
      var template = document.createElement("template");
      template.innerHTML = html.trim();
      var fresh = template.content.firstElementChild;
      if (!current || !fresh || fresh.id !== id) return;
      var focused = document.activeElement;
      var focusId = focused && focused.id && current.contains(focused) ? focused.id : null;
      var selection = null;
      try { if (focusId) selection = [focused.selectionStart, focused.selectionEnd]; } catch (e) { selection = null; }
      carryOver(current, fresh);
      giveToken(fresh);
      current.replaceWith(fresh);
      if (focusId) {
        var again = document.getElementById(focusId);
        if (again) {
          again.focus({ preventScroll: true });
          try { if (selection && selection[0] !== null) again.setSelectionRange(selection[0], selection[1]); } catch (e) { /* not a text field */ }
        }
      }
      document.dispatchEvent(new CustomEvent("live:updated", { detail: { id: id } }));
    }

    // Entries pushed to every page of a person carry no CSRF token: the page's own goes in.
    function giveToken(root) {
      var meta = document.querySelector('meta[name="csrf-token"]');
      if (!meta) return;
      root.querySelectorAll('form[method="post"]').forEach(function (form) {
        if (form.querySelector('input[name="csrfmiddlewaretoken"]')) return;
        var input = document.createElement("input");
        input.type = "hidden";
        input.name = "csrfmiddlewaretoken";
        input.value = meta.content;
        form.prepend(input);
      });
    }

    function element(html) {
      var template = document.createElement("template");
      template.innerHTML = html.trim();
      return template.content.firstElementChild;
    }

    // A patch: {order: [entry ids], items: {id: html of an entry new or changed},
    // working?: html}. Entries not sent stay as they are (what is typed in them, what is
    // open); the list is put in the order given. False when the page lacks an entry the
    // patch takes as shown: then one poll fetches the whole region.
    function patch(change, cursor) {
      var current = document.getElementById(id);
      var list = current && current.querySelector("ol");
      if (!list) return false;
      var fresh = {};
      Object.keys(change.items).forEach(function (key) {
        var node = element(change.items[key]);
        var old = document.getElementById(key);
        if (old) carryOver(old, node);
        giveToken(node);
        fresh[key] = node;
      });
      var nodes = change.order.map(function (key) { return fresh[key] || document.getElementById(key); });
      if (nodes.indexOf(null) !== -1) return false;
      var focused = document.activeElement;
      var keep = {};
      change.order.forEach(function (key) { keep[key] = true; });
      Array.prototype.slice.call(list.children).forEach(function (child) {
        if (!keep[child.id]) child.remove();
      });
      var next = list.firstElementChild;
      nodes.forEach(function (node) {
        if (node === next) { next = next.nextElementSibling; return; }
        var old = document.getElementById(node.id);
        if (old && old !== node) {
          if (old === next) next = next.nextElementSibling;
          old.remove();
        }
        list.insertBefore(node, next);
      });
      if (change.working !== undefined) {
        var working = current.querySelector("#" + CSS.escape(id) + "-working");
        if (working) working.replaceWith(element(change.working));
      }
      current.dataset.liveCursor = cursor;
      // Moving or replacing the entry that held the focus took it away: give it back.
      if (focused && focused.id && document.activeElement !== focused && current.contains(document.getElementById(focused.id))) {
        document.getElementById(focused.id).focus({ preventScroll: true });
      }
      document.dispatchEvent(new CustomEvent("live:updated", { detail: { id: id } }));
      return true;
    }

    // One poll: false once the page may not go on (the role is gone, or the login with
    // it: a redirect to the login page), true otherwise; a server that is down or answers
    // 5xx for a moment is asked again.
    function check() {
      var url = poll + "?since=" + encodeURIComponent(cursor());
      return fetch(url, { credentials: "same-origin", redirect: "manual", cache: "no-store" })
        .then(function (response) {
          if (response.status === 200) return response.text().then(function (html) { swap(html); return true; });
          if (response.type === "opaqueredirect") return false;
          return [401, 403, 404, 410].indexOf(response.status) === -1;
        })
        .catch(function () { return true; });
    }

    if (!stream || !window.EventSource) {
      (function loop() {
        check().then(function (goOn) { if (goOn) setTimeout(loop, POLL_MS); });
      })();
      return;
    }

    var retry = POLL_MS;
    (function open() {
      var source = new EventSource(stream + "?since=" + encodeURIComponent(cursor()));
      source.onmessage = function (event) { retry = POLL_MS; swap(event.data); };
      source.addEventListener("patch", function (event) {
        retry = POLL_MS;
        if (!patch(JSON.parse(event.data), event.lastEventId)) check();
      });
      source.onopen = function () { retry = POLL_MS; };
      source.addEventListener("gone", function () { source.close(); });
      source.onerror = function () {
        if (source.readyState !== EventSource.CLOSED) return;  // reconnecting by itself
        setTimeout(function () {
          check().then(function (goOn) { if (goOn) open(); });
        }, retry);
        retry = Math.min(retry * 2, MAX_RETRY_MS);
      };
    })();
  }

  function start() {
    document.querySelectorAll("[data-live-poll][id]").forEach(function (region) { keepLive(region.id); });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
