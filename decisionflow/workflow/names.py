"""The review workflow's names, apart from the engine: the version label and the executor ids.

Pages and cron commands need these names without loading agent-framework (about 0.3 s of
imports at every start); ``engine`` builds the graph from the same names.
"""

# The workflow's own version. It is recorded with every pending review, and a pending review
# from another version is never resumed by this code. Bump it whenever a message's shape or
# an executor's meaning changes: the engine's graph hash covers neither.
WORKFLOW_VERSION = "review-v2"
WORKFLOW_NAME = "decisionflow-review"

PREPARE_ID = "prepare"
HUMAN_REVIEW_ID = "human-review-v1"
COMMIT_ID = "commit"
