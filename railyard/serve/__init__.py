"""Layer 2: engine replicas on Ray Serve, with load- and prefix-aware routing, autoscaling on pending
requests, failover, several models and length pools (docs/architecture.md, "serve")."""
