"""Who is calling (bearer tokens -> ``Principal``) and which roles roles.yaml defines (``RoleBook``)."""

from gateway.auth.roles import RoleBook
from gateway.auth.tokens import Principal, TokenAuthenticator, TokenVerifier, create_token

__all__ = [
    "Principal", "RoleBook", "TokenAuthenticator", "TokenVerifier", "create_token",
]
