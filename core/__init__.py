"""The protocol, the errors, the locks and the append-only guards: what every layer shares.

It imports nothing of ours."""
