-- What the bench's wrk scripts share (bench/load.py runs them): each thread's number, the
-- statuses counted per thread, and one line at the end that bench/load.py parses:
--   BENCH-WRK {"requests": ..., "duration_us": ..., "p50_us": ..., "statuses": {...}, ...}
-- A script does `dofile(here .. "common.lua")` and defines init(args) and request().

local threads = {}

-- Main state: number the threads (1, 2, ...) before they start; each reads its own `tid`.
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end

-- Per thread (globals, so done() can read them with thread:get).
statuses = {}
exhausted = 0
sent = 0

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

-- The lines of a file, in order (slugs, prepared request ids).
function read_lines(path)
  local lines = {}
  for line in io.lines(path) do
    if line ~= "" then
      table.insert(lines, line)
    end
  end
  if #lines == 0 then
    error("no lines in " .. path)
  end
  return lines
end

local function json_counts(counts)
  local parts = {}
  for key, value in pairs(counts) do
    table.insert(parts, string.format('"%s": %d', tostring(key), value))
  end
  table.sort(parts)
  return "{" .. table.concat(parts, ", ") .. "}"
end

function done(summary, latency, requests)
  local total, ran_out = {}, 0
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses") or {}) do
      total[status] = (total[status] or 0) + count
    end
    ran_out = ran_out + (thread:get("exhausted") or 0)
  end
  local errors = summary.errors
  io.write(string.format(
    'BENCH-WRK {"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d,'
      .. ' "p99_us": %d, "max_us": %d, "statuses": %s, "exhausted": %d, "errors": {"connect":'
      .. ' %d, "read": %d, "write": %d, "status": %d, "timeout": %d}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, json_counts(total), ran_out, errors.connect,
    errors.read, errors.write, errors.status, errors.timeout
  ))
end
