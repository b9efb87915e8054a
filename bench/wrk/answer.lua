-- An approval's "yes" from a logged-in approver (session and CSRF cookies, the form's token).
-- The product's view answers a waiting approval once: each thread takes the next
-- "<slug> <request id>" line of its own file (<ids prefix>.<thread>), which bench/web.py
-- filled with approvals it made before the run; past the last one it asks for
-- /bench/exhausted/ (a 404), counted, and the run fails saying so. wrk calls the first
-- thread's request() once before the run, to check the script, and each connection prepares
-- a request the run's end may leave unsent: an id so taken stays waiting, unanswered.
-- The same-shape reference view only stores: with "-" for the ids prefix, request ids are
-- the run's tag, the thread and a counter, over the slugs.
--   wrk ... -s answer.lua URL -- <slugs file> <cookie header> <csrf token> <path prefix>
--                               <ids prefix or -> <run tag>
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "common.lua")

local slugs, token, prefix, ids, tag, body
local headers = {["Content-Type"] = "application/x-www-form-urlencoded"}

function init(args)
  slugs = read_lines(args[1])
  headers["Cookie"] = args[2]
  token = args[3]
  prefix = args[4]
  if args[5] ~= "-" then
    ids = read_lines(args[5] .. "." .. tid)
  end
  tag = args[6]
  body = "csrfmiddlewaretoken=" .. token .. "&answer=yes"
end

function request()
  sent = sent + 1
  local slug, request_id
  if ids then
    local line = ids[sent]
    if line == nil then
      exhausted = exhausted + 1
      return wrk.format("GET", "/bench/exhausted/")
    end
    slug, request_id = line:match("^(%S+) (%S+)$")
  else
    slug, request_id = slugs[sent % #slugs + 1], tag .. "-" .. tid .. "-" .. sent
  end
  return wrk.format("POST", prefix .. slug .. "/" .. request_id .. "/", headers, body)
end
