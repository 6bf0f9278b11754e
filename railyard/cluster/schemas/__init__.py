"""Vendored CRD schemas (package data); see README.md for their sources and versions."""
