"""The OpenAPI contracts, shipped as package data (`openapi/` in the repository)."""
