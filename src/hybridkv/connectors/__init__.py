"""KV connectors: moving KV blocks between an engine's paged caches and external tiers."""
