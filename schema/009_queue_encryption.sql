-- 009 at-rest encryption: Queen's encryptionEnabled option. Payloads pushed to such a queue (and
-- timers scheduled for it) are stored sealed with AES-256-GCM under QUEEN_ENCRYPTION_KEY
-- (queen_trio/sealing.py); the broker opens them on every read. Frames already stored keep the
-- form they were written in, so the option can change without rewriting anything.
ALTER TABLE queen.queues ADD COLUMN encryption_enabled boolean NOT NULL DEFAULT false;
