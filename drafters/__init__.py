"""Everything about DSpark drafters: profiles, checkpoint validation, cost and acceptance models, the replica simulator, the vLLM extension."""
