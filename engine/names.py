"""The review workflow's names, apart from the engine: the version label and the executor ids.

Pages and cron commands need these names without loading agent-framework (about 0.3 s of
imports at every start); ``engine`` builds the graph from the same names.
"""

# The workflow's own version. It is recorded with every pending review, and a pending review
# from another version is never resumed by this code. Bump it whenever a message's shape or
# an executor's meaning changes. A change to a message's declared schema (messages.py), an
# executor id or an edge changes the graph fingerprint, which is recorded with every pause
# too: such a pause is refused even when this label was not bumped.
WORKFLOW_VERSION = "review-v3"
WORKFLOW_NAME = "decisionflow-review"

PREPARE_ID = "prepare"
HUMAN_REVIEW_ID = "human-review-v1"
COMMIT_ID = "commit"

# The graph's edges, in order; ``engine.build_workflow`` wires exactly these (it checks so at
# import), and the graph fingerprint (messages.py) covers them.
EDGES = ((PREPARE_ID, HUMAN_REVIEW_ID), (HUMAN_REVIEW_ID, COMMIT_ID))
