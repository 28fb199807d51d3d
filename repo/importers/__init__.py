"""Importers from other stores, each on the public repository API only."""
