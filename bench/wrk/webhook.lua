-- The GitHub webhook by slug, signed: one body whose HMAC-SHA256 signature bench/web.py
-- computed once (it covers the body only), a new X-GitHub-Delivery per request (the run's
-- tag, the thread, a counter), so every delivery is new and answered 202.
--   wrk ... -s webhook.lua URL -- <slugs file> <body file> <sha256=signature> <run tag>
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "common.lua")

local slugs, body, tag
local headers = {
  ["Content-Type"] = "application/json",
  ["X-GitHub-Hook-ID"] = "1",
  ["X-GitHub-Event"] = "issues",
}

function init(args)
  slugs = read_lines(args[1])
  local file = assert(io.open(args[2], "rb"))
  body = file:read("*a")
  file:close()
  headers["X-Hub-Signature-256"] = args[3]
  tag = args[4]
end

function request()
  sent = sent + 1
  headers["X-GitHub-Delivery"] = tag .. "-" .. tid .. "-" .. sent
  local slug = slugs[sent % #slugs + 1]
  return wrk.format("POST", "/hooks/github/" .. slug .. "/", headers, body)
end
