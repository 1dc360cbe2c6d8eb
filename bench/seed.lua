-- wrk script for the seed scenario: 25 tenants, a fixed pace per connection (delay), and
-- the p50/p95/p99 latencies. TENANT_OFFSET spreads the tenants across wrk processes.
local n = 0
local pace_ms = tonumber(os.getenv("PACE_MS") or "30")
request = function()
  n = n + 1
  local t = "tenant-" .. (n % 25)
  return wrk.format("GET", "/v1/organizations/" .. t .. "/product/1", { ["x-org-id"] = t })
end
delay = function()
  return pace_ms
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d errors=%d p50_us=%d p95_us=%d p99_us=%d\n",
    summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
