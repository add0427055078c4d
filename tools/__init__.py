"""Development tools of the repository (never installed, never imported by the product)."""
