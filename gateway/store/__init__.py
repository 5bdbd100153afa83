"""State shared by the server, the CLI and the approval page: tokens and proposals.

Code against ``StateStore``; ``SqliteStore`` is the implementation on one file under the gateway
home (``Settings.state_db``).
"""

from gateway.store.base import FINAL_STATES, PROPOSAL_STATES, Proposal, StateStore, TokenRecord, new_id
from gateway.store.sqlite import SqliteStore

__all__ = [
    "FINAL_STATES", "PROPOSAL_STATES", "Proposal", "SqliteStore", "StateStore", "TokenRecord", "new_id",
]
