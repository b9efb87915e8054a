"""The inbox's memory page: the Claude agent's memory files (alwayson/claude/memory.py), each
with its history, every version linked to the run that wrote it or naming the person who did.

Any role in the inbox reads; a manager also corrects a file, writes a new one or deletes one.
Each of their changes is a version naming them: the memory's own audit trail.
"""

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from alwayson.claude.memory import ROOT, delete_file, write_file
from alwayson.claude.models import MemoryFile, MemoryVersion
from inbox import clock
from inbox.models import Inbox, Role

NO_INBOX = "No inbox matches the given query."
READ_ONLY = (
    "You can read this memory but not change it: correcting the agent's memory takes the"
    " manager role in this inbox."
)


class MemoryForm(forms.Form):
    path = forms.CharField(
        label="Path",
        max_length=255,
        help_text=f"Under {ROOT}, for example {ROOT}/owner.md",
    )
    content = forms.CharField(
        label="Content", required=False, strip=False, widget=forms.Textarea(attrs={"rows": 14})
    )


def _inbox(request, slug) -> Inbox:
    try:
        return Inbox.objects.get_with_role(request.user, slug)
    except Inbox.DoesNotExist:
        raise Http404(NO_INBOX) from None


def _save(request, inbox, form) -> bool:
    """The form's file written as the person's: True, or False with the refusal on the form."""
    if not form.is_valid():
        return False
    try:
        version = write_file(
            inbox.pk,
            form.cleaned_data["path"],
            form.cleaned_data["content"],
            request.user,
            clock.database_now(),
        )
    except ValueError as refused:
        field, _, reason = str(refused).partition(": ")
        form.add_error(field if field in form.fields else None, reason or str(refused))
        return False
    messages.success(request, f"Saved {version.path}.")
    form.saved_path = version.path
    return True


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def memory_list(request, slug):
    inbox = _inbox(request, slug)
    manager = inbox.has_role(request.user, Role.MANAGER)
    status = 200
    form = MemoryForm(initial={"path": f"{ROOT}/"})
    if request.method == "POST":
        form = MemoryForm(request.POST)
        if not manager:
            form.is_valid()
            form.add_error(None, READ_ONLY)
            status = 403
        elif _save(request, inbox, form):
            return redirect("memory-file", slug=inbox.slug, name=form.saved_path[len(ROOT) + 1 :])
        else:
            status = 400
    files = MemoryFile.objects.filter(inbox=inbox).order_by("path")
    context = {"inbox": inbox, "files": files, "manager": manager, "form": form}
    return render(request, "alwayson/memory.html", context, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def memory_file(request, slug, name):
    inbox = _inbox(request, slug)
    manager = inbox.has_role(request.user, Role.MANAGER)
    path = f"{ROOT}/{name}"
    found = MemoryFile.objects.filter(inbox=inbox, path=path).first()
    history = list(
        MemoryVersion.objects.filter(inbox=inbox, path=path)
        .select_related("person")
        .order_by("-id")
    )
    if found is None and not history:
        raise Http404("No memory file of this inbox has this path.")
    status = 200
    form = MemoryForm(initial={"path": path, "content": found.content if found else ""})
    if request.method == "POST":
        if not manager:
            form = MemoryForm({"path": path, "content": request.POST.get("content", "")})
            form.is_valid()
            form.add_error(None, READ_ONLY)
            status = 403
        elif "delete" in request.POST:
            if delete_file(inbox.pk, path, request.user, clock.database_now()):
                messages.success(request, f"Deleted {path}.")
            return redirect("memory", slug=inbox.slug)
        else:
            form = MemoryForm({"path": path, "content": request.POST.get("content", "")})
            if _save(request, inbox, form):
                return redirect("memory-file", slug=inbox.slug, name=name)
            status = 400
    context = {
        "inbox": inbox,
        "file": found,
        "path": path,
        "history": history,
        "manager": manager,
        "form": form,
    }
    return render(request, "alwayson/memory_file.html", context, status=status)
