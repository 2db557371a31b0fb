"""The journal's tables in PostgreSQL, created (or brought up to date) when the ledger opens.

Append-only by construction, not by convention: triggers refuse every UPDATE, DELETE and
TRUNCATE of the journal, and a deferred constraint trigger refuses a transaction that leaves an
entry whose postings do not add up to zero. A mistake is corrected by a new entry, never by
editing an old one.
"""

from __future__ import annotations

from typing import Final

SCHEMA_VERSION: Final = 1

MIGRATION: Final = """
CREATE TABLE IF NOT EXISTS ledger_entries (
    id           bigserial PRIMARY KEY,
    ref          text        NOT NULL UNIQUE,
    kind         text        NOT NULL,
    occurred_at  timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    amount_micro bigint      NOT NULL CHECK (amount_micro >= 0),
    wallet       text        NOT NULL,
    route        text,
    facilitator  text,
    signature    text,
    payment_key  text
);
ALTER TABLE ledger_entries ADD COLUMN IF NOT EXISTS payment_key text;
CREATE INDEX IF NOT EXISTS ledger_entries_wallet ON ledger_entries (wallet, id);
CREATE INDEX IF NOT EXISTS ledger_entries_occurred ON ledger_entries (occurred_at);
CREATE INDEX IF NOT EXISTS ledger_entries_kind_occurred ON ledger_entries (kind, occurred_at);
CREATE INDEX IF NOT EXISTS ledger_entries_signature ON ledger_entries (signature)
    WHERE signature IS NOT NULL;

CREATE TABLE IF NOT EXISTS ledger_postings (
    entry_id     bigint NOT NULL REFERENCES ledger_entries (id),
    account      text   NOT NULL,
    amount_micro bigint NOT NULL,
    PRIMARY KEY (entry_id, account)
);
CREATE INDEX IF NOT EXISTS ledger_postings_account ON ledger_postings (account);

CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % on % refused', TG_OP, TG_TABLE_NAME;
END $$;

CREATE OR REPLACE FUNCTION ledger_entry_balances() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT coalesce(sum(amount_micro), 0) FROM ledger_postings WHERE entry_id = NEW.entry_id) <> 0 THEN
        RAISE EXCEPTION 'ledger entry % does not balance', NEW.entry_id;
    END IF;
    RETURN NULL;
END $$;

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['ledger_entries', 'ledger_postings'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_trigger
                       WHERE tgrelid = t::regclass AND tgname = t || '_append_only') THEN
            EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW '
                           'EXECUTE FUNCTION ledger_append_only()', t || '_append_only', t);
            EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT '
                           'EXECUTE FUNCTION ledger_append_only()', t || '_no_truncate', t);
        END IF;
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgrelid = 'ledger_postings'::regclass AND tgname = 'ledger_postings_balance') THEN
        CREATE CONSTRAINT TRIGGER ledger_postings_balance AFTER INSERT ON ledger_postings
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_entry_balances();
    END IF;
END $$;
"""
