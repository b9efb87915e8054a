-- The chat form post of a person logged in once through the login form (bench/web.py
-- passes the session and CSRF cookies and the form's token): a new message_id per request,
-- UUID-shaped from the run's number, the thread and a counter, so each is a new message
-- (302 to the page).
--   wrk ... -s chat.lua URL -- <slugs file> <cookie header> <csrf token> <run number>
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "common.lua")

local slugs, token, run
local headers = {["Content-Type"] = "application/x-www-form-urlencoded"}
local TEXT = "Where+is+my+parcel%3F+It+was+due+on+Monday."

function init(args)
  slugs = read_lines(args[1])
  headers["Cookie"] = args[2]
  token = args[3]
  run = tonumber(args[4])
end

function request()
  sent = sent + 1
  local message_id = string.format("%08x-%04x-4000-8000-%012x", run, tid, sent)
  local body = "csrfmiddlewaretoken=" .. token .. "&message_id=" .. message_id .. "&text=" .. TEXT
  local slug = slugs[sent % #slugs + 1]
  return wrk.format("POST", "/inbox/" .. slug .. "/", headers, body)
end
