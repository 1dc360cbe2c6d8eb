-- wrk script of scripts/bench-fleet-sizing: each request names a tenant drawn at random from
-- TENANTS (`t1` .. `tN`, on /v1/, a per-tenant rule far from its limit); one request in
-- HOT_EVERY goes to /hot/ as tenant HOT_TENANT (a per-tenant rule held at its limit), 0: none;
-- TENANT alone: every request as that tenant on /v1/. DELAY_MS: each connection waits that
-- long after an answer before its next request (wrk's `delay`), which paces the load at about
-- connections x 1000 / DELAY_MS requests a second. Prints one RESULT line: requests, answers
-- by class (2xx, 429, 5xx, other) and socket errors.
local tenants = tonumber(os.getenv("TENANTS") or "1000")
local hot = tonumber(os.getenv("HOT_EVERY") or "20")
local hot_tenant = os.getenv("HOT_TENANT") or "hot"
local one = os.getenv("TENANT")
local pause = tonumber(os.getenv("DELAY_MS") or "0")
math.randomseed(tonumber(os.getenv("WRK_SEED") or "1"))
local threads = {}
setup = function(thread) table.insert(threads, thread) end
init = function() ok, n429, n5xx, other = 0, 0, 0, 0 end
request = function()
  if one then return wrk.format("GET", "/v1/x", { ["x-org-id"] = one }) end
  if hot > 0 and math.random(hot) == 1 then
    return wrk.format("GET", "/hot/x", { ["x-org-id"] = hot_tenant })
  end
  return wrk.format("GET", "/v1/x", { ["x-org-id"] = "t" .. math.random(tenants) })
end
if pause > 0 then delay = function() return pause end end
response = function(status)
  if status < 300 then ok = ok + 1
  elseif status == 429 then n429 = n429 + 1
  elseif status >= 500 then n5xx = n5xx + 1
  else other = other + 1 end
end
done = function(summary)
  local s = { ok = 0, n429 = 0, n5xx = 0, other = 0 }
  for _, t in ipairs(threads) do
    for k in pairs(s) do s[k] = s[k] + (t:get(k) or 0) end
  end
  io.write(string.format("RESULT requests=%d ok=%d r429=%d r5xx=%d other=%d errors=%d\n",
    summary.requests, s.ok, s.n429, s.n5xx, s.other,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
