-- wrk script: spread requests over 25 tenants (x-org-id: tenant-0 .. tenant-24).
local n = 0
request = function()
  n = n + 1
  local path = "/v1/organizations/tenant-" .. (n % 25) .. "/product/" .. (n % 100)
  return wrk.format("GET", path, { ["x-org-id"] = "tenant-" .. (n % 25) })
end

-- No response() callback: it makes wrk build a Lua table of every response's headers, which
-- slows the load generator in proportion to the headers the gateway adds and biases the ratio.

done = function(summary, latency, requests)
  io.write(string.format("RESULT rps=%.1f p50_us=%d p99_us=%d errors=%d non2xx=%d\n",
    summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99),
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.errors.status))
end
