"""Who may call: API tokens, roles, their lookups and expiry, and where the service may listen without them."""
