-- Runtime queries about tenants.

-- name: tenant_id_by_name
SELECT tenant_id FROM queen.tenants WHERE name = %(name)s
