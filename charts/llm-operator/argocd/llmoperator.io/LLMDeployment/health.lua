-- Argo CD health of an LLMDeployment, from the status the operator writes (docs/rollouts.md).
-- Written for argocd-cm, where scripts run without Lua's string and math libraries.
local hs = {status = "Progressing", message = "Waiting for the operator to report"}
local st = obj.status
if st == nil then
  return hs
end

local function condition(kind)
  if st.conditions ~= nil then
    for _, c in ipairs(st.conditions) do
      if c.type == kind then
        return c
      end
    end
  end
  return nil
end

local function is_true(kind)
  local c = condition(kind)
  return c ~= nil and c.status == "True", c
end

-- A status written for an older spec says nothing about the one just synced.
if st.observedGeneration == nil or st.observedGeneration ~= obj.metadata.generation then
  hs.message = "Waiting for the operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end

local revisions = st.revisions or {}
local stalled, c = is_true("Stalled")
if stalled then
  hs.status, hs.message = "Degraded", c.message
  return hs
end
if revisions.phase == "Aborted" then
  hs.status, hs.message = "Degraded", revisions.abortReason or revisions.message or "Canary aborted"
  return hs
end
local degraded, d = is_true("Degraded")
if degraded then
  hs.status, hs.message = "Degraded", d.message
  return hs
end
if revisions.phase == "Paused" then
  hs.status, hs.message = "Suspended", revisions.message or "Canary paused until promoted"
  return hs
end
local reconciling, r = is_true("Reconciling")
if reconciling then
  hs.message = revisions.message or r.message
  return hs
end
local ready, ok = is_true("Ready")
if ready then
  hs.status, hs.message = "Healthy", ok.message
  return hs
end
if ok ~= nil then
  hs.message = ok.message
end
return hs
