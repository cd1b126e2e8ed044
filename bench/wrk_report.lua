-- Shared by every bench run: print the results as one JSON line wrk's own text lacks.
-- Optional environment: WRK_METHOD, WRK_BODY, WRK_CONTENT_TYPE (for the POST login), WRK_BODIES_FILE.
local method = os.getenv("WRK_METHOD")
if method then
  wrk.method = method
  wrk.body = os.getenv("WRK_BODY") or ""
  wrk.headers["Content-Type"] = os.getenv("WRK_CONTENT_TYPE") or "application/json"
end

-- Optional WRK_BODIES_FILE: one body per line, sent in turn (many tokens, not one).
local bodies_file = os.getenv("WRK_BODIES_FILE")
if bodies_file then
  local bodies = {}
  for line in io.lines(bodies_file) do table.insert(bodies, line) end
  local n = 0
  request = function()
    n = n % #bodies + 1
    return wrk.format(nil, nil, nil, bodies[n])
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"connect_errors":%d,"read_errors":%d,"write_errors":%d,"timeouts":%d,"non_2xx_3xx":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.timeout, e.status))
end
