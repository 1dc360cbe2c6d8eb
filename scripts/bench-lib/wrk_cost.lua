-- The wrk script of scripts/bench-cost: GET /v1/organizations/tenant-I/product/42 with
-- `x-org-id: tenant-I`, I rotating over 25 tenants, no response() callback (see
-- bench/tenants.lua); prints one RESULT line. With COST_RATE set, paced (see below).

local n = 0
request = function()
  n = n + 1
  local t = "tenant-" .. (n % 25)
  return wrk.format("GET", "/v1/organizations/" .. t .. "/product/42", { ["x-org-id"] = t })
end
-- Paced mode (COST_RATE: requests per second for this thread): every request gets the next
-- slot of a fixed schedule, so the offered rate does not depend on the latency (open loop).
-- wrk only calls delay() when the script defines it, so the unpaced mode stays free of timers.
local rate = tonumber(os.getenv("COST_RATE") or "")
if rate then
  local ffi = require("ffi")
  ffi.cdef [[ typedef struct { long s; long ns; } cost_ts; int clock_gettime(int, cost_ts *); ]]
  local ts = ffi.new("cost_ts")
  local interval, next_at = 1e6 / rate, nil
  delay = function()
    ffi.C.clock_gettime(1, ts)
    local now = tonumber(ts.s) * 1e6 + tonumber(ts.ns) / 1e3
    if not next_at then next_at = now end
    local d = (next_at - now) / 1000
    next_at = next_at + interval
    if d <= 0 then return 0 end
    return math.floor(d + 0.5)
  end
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT rps=%.1f p50_us=%d p99_us=%d p999_us=%d errors=%d non2xx=%d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
