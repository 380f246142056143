"""The review workflow: the engine, its checkpoint store, begin/resume/edit and the one decision
service, and the channels that drive it (the review workplace admin pages and the commands)."""
