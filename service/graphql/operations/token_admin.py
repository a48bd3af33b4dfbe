"""Token admin over GraphQL (operators only, see permissions.py): create, list, revoke."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

import strawberry

from service import paging
from service.access_control import tokens
from service.access_control.tokens import FIRST_TOKEN_WARNING, NewToken, TokenRecord
from service.database import connections
from service.database.connections import Connection

from ..context import Info
from ..pages import answer, paged


@strawberry.enum(description="What a token may do; see docs/security/roles.md.")
class Role(Enum):
    READER = "reader"
    AGENT = "agent"
    SCHEDULER = "scheduler"
    OPERATOR = "operator"


@strawberry.enum(description="Whether a token is accepted, by the service's clock.")
class TokenStatus(Enum):
    ACTIVE = "active"
    EXPIRED = "expired"
    REVOKED = "revoked"


@strawberry.type(description="A bearer token, without its secret (only its digest is stored).")
class ApiToken:
    id: strawberry.ID
    role: Role
    node_id: strawberry.ID | None = strawberry.field(
        description="The one node an agent token may report for."
    )
    description: str | None
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = strawberry.field(
        description="When the token stops being accepted; null: never."
    )
    status: TokenStatus = strawberry.field(
        description=(
            "ACTIVE, EXPIRED (past expiresAt) or REVOKED (revokeToken; wins over EXPIRED), "
            "judged by the service's database clock when read."
        )
    )
    tenant: strawberry.ID | None = strawberry.field(
        default=None,
        description="The tenant a scheduler token places as (it may name no other); null: unbound.",
    )

    @classmethod
    def of(cls, record: TokenRecord) -> ApiToken:
        return cls(
            id=strawberry.ID(record.id),
            role=Role(record.role),
            node_id=strawberry.ID(record.node_id) if record.node_id is not None else None,
            description=record.description,
            created_at=record.created_at,
            revoked_at=record.revoked_at,
            expires_at=record.expires_at,
            status=TokenStatus(record.status),
            tenant=None if record.tenant is None else strawberry.ID(record.tenant),
        )


@strawberry.type
class CreatedToken:
    token: ApiToken
    secret: str = strawberry.field(
        description="Send as 'Authorization: Bearer <secret>'. Shown this once; not stored."
    )
    warning: str | None = strawberry.field(
        default=None,
        description=(
            "Set when this token put tokens in force (the first token, with no "
            "INVENTORY_BOOTSTRAP_TOKEN): every caller without a token, running agents, ctl "
            "and the dashboard included, is refused from its next request."
        ),
    )

    @classmethod
    def of(cls, new: NewToken, *, tokens_were_in_force: bool) -> CreatedToken:
        warning = FIRST_TOKEN_WARNING if new.first and not tokens_were_in_force else None
        return cls(token=ApiToken.of(new.token), secret=new.secret, warning=warning)


@strawberry.type
class TokenQueries:
    @strawberry.field(
        description=paged(
            "Tokens sorted by id: active and expired ones (told apart by `status`), revoked "
            "ones only with includeRevoked."
        )
    )
    async def tokens(
        self,
        info: Info,
        include_revoked: bool = False,
        first: int | None = None,
        after: strawberry.ID | None = None,
    ) -> list[ApiToken]:
        request = info.context.page_request(first)
        async with connections.autocommit(info.context.engine) as conn:
            found = await tokens.list_tokens(
                conn,
                include_revoked=include_revoked,
                first=request.limit,
                after=str(after) if after is not None else None,
            )
        return answer(paging.cut(found, request, lambda t: t.id), ApiToken.of)


@strawberry.type
class TokenMutations:
    @strawberry.mutation(
        description=(
            "Operator: a new token. An agent token needs nodeId, the one node it may report for. "
            "With expiresAt (in the future, with a time zone) the token is refused from then on "
            "(401 'token expired'), and subscriptions made with it end. A scheduler token "
            "with tenant places only as that tenant (an existing one); naming another is "
            "FORBIDDEN. The secret is in the answer and nowhere else."
        )
    )
    async def create_token(
        self,
        info: Info,
        role: Role,
        node_id: strawberry.ID | None = None,
        description: str | None = None,
        expires_at: datetime | None = None,
        tenant: strawberry.ID | None = None,
    ) -> CreatedToken:
        async def work(conn: Connection) -> NewToken:
            return await tokens.create_token(
                conn,
                role.value,
                str(node_id) if node_id is not None else None,
                description,
                expires_at,
                str(tenant) if tenant is not None else None,
            )

        created = await info.context.write(work)
        if info.context.authenticator is not None:
            # Enforce tokens on this process from the next request on.
            info.context.authenticator.forget()
        # A bootstrap token already put tokens in force: the first stored one changes nothing.
        bootstrap = bool(info.context.settings.bootstrap_token)
        return CreatedToken.of(created, tokens_were_in_force=bootstrap)

    @strawberry.mutation(
        description=(
            "Operator: stop accepting a token, from the next request on; subscriptions made "
            "with it end within 2 seconds, in every service process."
        )
    )
    async def revoke_token(self, info: Info, id: strawberry.ID) -> ApiToken:
        async def work(conn: Connection) -> TokenRecord:
            return await tokens.revoke_token(conn, str(id))

        return ApiToken.of(await info.context.write(work))
