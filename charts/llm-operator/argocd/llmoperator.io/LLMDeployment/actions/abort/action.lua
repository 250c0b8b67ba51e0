-- Ask the operator to abort: it handles each value once (status.revisions.lastAction), and
-- the time token lets the same action be asked again.
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["llmoperator.io/rollout-action"] = "abort/" .. os.time()
return obj
