-- 004 KV on Queen's wire: a version per write, and names compared byte by byte.

-- Every write stamps the row with nextval of this sequence: its version, which `expect` names
-- and which a lock answers as its fencing token. A sequence, never version + 1, so a key that
-- expired, was removed and was written again cannot reissue a version an old holder still
-- carries. No CACHE (the default 1): values are handed out in the order nextval is called
-- across every session, so a write that starts after another committed always gets a higher
-- version, which is what makes a later lock holder's token higher. Gaps are expected (a
-- rolled-back write spends its number).
CREATE SEQUENCE queen.kv_version_seq AS bigint;

-- Rows written before this migration keep their value and their expiry (NULL, no TTL, is
-- `forever` on the wire) and get a version each, in key order.
ALTER TABLE queen.kv ADD COLUMN version bigint;
UPDATE queen.kv k SET version = v.version
FROM (SELECT tenant_id, namespace, key,
             nextval('queen.kv_version_seq') AS version
      FROM (SELECT tenant_id, namespace, key FROM queen.kv
            ORDER BY tenant_id, namespace COLLATE "C", key COLLATE "C") ordered) v
WHERE (k.tenant_id, k.namespace, k.key) = (v.tenant_id, v.namespace, v.key);
ALTER TABLE queen.kv ALTER COLUMN version SET NOT NULL;

-- Byte order for both names: prefix reads page by `after` in an order that does not depend on
-- the server's locale (the same on every machine and after a libc upgrade), `key >= prefix`
-- can use the primary key, and a batch locks its keys in the order the broker sorts them in
-- (Python compares code points, which is UTF-8 byte order).
ALTER TABLE queen.kv
    ALTER COLUMN namespace TYPE text COLLATE "C",
    ALTER COLUMN key TYPE text COLLATE "C";
