-- wrk script for the Redis cost benchmark: each request names a tenant drawn at random from
-- TENANTS; one request in 20 goes to /hot/, a partition kept at its limit (50 a minute for
-- the whole fleet); the others to /v1/, far from their limit.
local tenants = tonumber(os.getenv("TENANTS") or "3")
local hot = tonumber(os.getenv("HOT_EVERY") or "20")
math.randomseed(tonumber(os.getenv("WRK_SEED") or "1"))
request = function()
  local t = "t" .. math.random(tenants)
  local path = (hot > 0 and math.random(hot) == 1) and "/hot/x" or "/v1/x"
  return wrk.format("GET", path, { ["x-org-id"] = t })
end
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d errors=%d\n", summary.requests,
    summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
