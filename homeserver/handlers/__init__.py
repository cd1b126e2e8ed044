"""HTTP handlers, one module per area, each ending with its ROUTES list."""
