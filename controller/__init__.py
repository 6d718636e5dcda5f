"""specgate's speculation controller: measure acceptance and regime, decide per-tenant policies, publish them."""
