"""Recorded workflow histories for replay tests, and the script that records them."""
