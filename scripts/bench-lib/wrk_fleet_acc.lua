-- The wrk script of scripts/bench-fleet's accuracy runs: `x-org-id` from TENANT; prints one
-- RESULT line (requests, non-2xx answers, errors).

wrk.headers["x-org-id"] = os.getenv("TENANT")
done = function(summary, latency, requests)
  io.write(string.format("RESULT requests=%d non2xx=%d errors=%d\n", summary.requests,
    summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
