"""Who is calling (bearer tokens -> ``Principal``) and what they may do (``Role``, ``permits``)."""

from gateway.auth.roles import BUILTIN_ROLES, Role, RoleBook, permits
from gateway.auth.tokens import Principal, TokenAuthenticator, TokenVerifier, create_token

__all__ = [
    "BUILTIN_ROLES", "Principal", "Role", "RoleBook", "TokenAuthenticator", "TokenVerifier", "create_token",
    "permits",
]
