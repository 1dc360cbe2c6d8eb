-- The wrk script of scripts/bench-tenant-memory: GET /x with `x-org-id: tenant-I`, I counting
-- 1 .. TENANTS over and over.

local n = 0
local limit = tonumber(os.getenv("TENANTS"))
request = function()
  n = n + 1
  if n > limit then n = 1 end
  return wrk.format("GET", "/x", { ["x-org-id"] = "tenant-" .. n })
end
