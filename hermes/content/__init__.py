"""Content: what a session says and what that costs.

Message bodies kept once by content hash, token estimates and the daily token usage, the
context builder that fits a model call into its window, previews of long texts, and the
turn events streamed to whoever watches a turn. The modules are imported by name
(``from hermes.content.tokens import TokenCounter``), this package re-exports nothing.
"""
