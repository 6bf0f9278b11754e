"""Layer 1, the cluster: render and validate Kubernetes/KubeRay manifests, preflight GPU nodes, plan placement.

Imports nothing from the engine, serve or api packages, and never torch: it must run on a laptop
with only kubectl's view of the cluster.
"""
