-- 003 tenants' plans and tokens, storage usage, KV state.

-- A plan: the message ceiling, the storage gate and the request-rate quota. NULL = unlimited.
ALTER TABLE queen.tenants
    ADD COLUMN max_message_bytes   integer NOT NULL DEFAULT 1048576
        CHECK (max_message_bytes BETWEEN 1 AND 1048576),
    ADD COLUMN max_stored_bytes    bigint CHECK (max_stored_bytes >= 0),
    ADD COLUMN requests_per_second integer CHECK (requests_per_second >= 1),
    ADD COLUMN plan_updated_at     timestamptz NOT NULL DEFAULT now();

-- Bearer tokens: shown once at creation, stored as a salted SHA-256 of the secret part. The
-- prefix (public, unique) finds the row; the hash is compared in constant time.
CREATE TABLE queen.tenant_tokens (
    token_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id  integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    prefix     text        NOT NULL UNIQUE,
    salt       bytea       NOT NULL,
    hash       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- Stored bytes per tenant, for the storage gate. Writers append deltas (no hot row to fight
-- over); the broker folds them into tenant_usage every second.
CREATE TABLE queen.usage_deltas (
    tenant_id integer NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    bytes     bigint  NOT NULL
);
CREATE TABLE queen.tenant_usage (
    tenant_id    integer PRIMARY KEY REFERENCES queen.tenants ON DELETE CASCADE,
    stored_bytes bigint  NOT NULL DEFAULT 0
);

CREATE TABLE queen.kv (
    tenant_id  integer     NOT NULL REFERENCES queen.tenants ON DELETE CASCADE,
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    size_bytes integer     NOT NULL,
    expires_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, namespace, key)
);
-- The purge task's scan: only keys that can expire.
CREATE INDEX kv_expiry ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;
