-- 001 foundation: the queen schema and its tenants.
--
-- Every other table of the broker carries a tenant_id referencing this table: tenants are the
-- unit of isolation. With QUEEN_AUTH=off every request belongs to the tenant named 'default'.

CREATE SCHEMA IF NOT EXISTS queen;

CREATE TABLE queen.tenants (
    tenant_id  integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL UNIQUE
               CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,62}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO queen.tenants (name) VALUES ('default');
