"""Sessions: the session book (who may name a session, tokens, locks) and the sorted index the
control plane pages through."""
