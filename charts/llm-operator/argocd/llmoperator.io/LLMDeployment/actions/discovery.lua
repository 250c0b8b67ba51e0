-- Rollout actions of an LLMDeployment: each sets the annotation llmoperator.io/rollout-action,
-- offered only when the canary rollout can act on it (docs/rollouts.md).
local revisions = {}
if obj.status ~= nil and obj.status.revisions ~= nil then
  revisions = obj.status.revisions
end
local canary = revisions.canary ~= nil
local aborted = revisions.phase == "Aborted"
local stepping = canary and (revisions.phase == "Progressing" or revisions.phase == "Paused")
local actions = {}
actions["promote"] = {["disabled"] = not stepping, ["displayName"] = "Promote (next step)"}
actions["promote-full"] = {["disabled"] = not stepping, ["displayName"] = "Promote fully (skip steps)"}
actions["abort"] = {["disabled"] = not canary or aborted, ["displayName"] = "Abort canary"}
actions["retry"] = {["disabled"] = not aborted, ["displayName"] = "Retry canary"}
return actions
