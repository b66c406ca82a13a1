#!/usr/bin/env python3
"""What SQLite itself costs for a payment, without onceflow or any thread hand-off.

The two transactions a payment commits on SQLite (phase 1: token, record, order, workflow row with its 4
compensations, 4 step rows; phase 2: order, record, token, 2 step rows, workflow), on onceflow's SQLite schema, WAL
and `synchronous = FULL`, one connection in a loop. With `--per-commit N`, N payments' phases share one
commit, each in a savepoint (what group commit would do). README "Benchmark" quotes these.

    python3 tests/benches/sqlite_floor.py                    # ~1,450–1,850 payments/s on the 2-core dev machine
    python3 tests/benches/sqlite_floor.py --per-commit 8     # ~5,200–6,800 payments/s
"""
import argparse
import json
import os
import shutil
import sqlite3
import tempfile
import time

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
# onceflow's SQLite schema: the engine's and the payment service's migration folders, or, where neither exists
# (before they were split by crate), the one folder they shared.
SPLIT_MIGRATIONS = [
    os.path.join(ROOT, "engine", "migrations", "sqlite"),
    os.path.join(ROOT, "payment-workflow", "migrations", "sqlite"),
]
SHARED_MIGRATIONS = os.path.join(ROOT, "migrations", "sqlite")


def migrations():
    """The `*.sql` files of the migration folders, in file-name order across them (the order of their versions)."""
    folders = [f for f in SPLIT_MIGRATIONS if os.path.isdir(f)] or [SHARED_MIGRATIONS]
    files = sorted((name, os.path.join(folder, name)) for folder in folders for name in os.listdir(folder)
                   if name.endswith(".sql"))
    if not files:
        raise SystemExit(f"no *.sql migrations in {', '.join(folders)}")
    return [path for _, path in files]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--per-commit", type=int, default=1)
    args = parser.parse_args()
    path = os.path.join(tempfile.mkdtemp(), "floor.db")
    c = sqlite3.connect(path, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = FULL")
    for migration in migrations():
        c.executescript(open(migration).read())
    c.execute("BEGIN")
    for n in range(args.count):
        c.execute("INSERT INTO orders VALUES ('default', ?, 1000, 'CNY', 'pending', 0, 0, 0, NULL)", (f"o{n}",))
        c.execute(
            "INSERT INTO idempotency_tokens (token, tenant, state, created_at, expires_at, updated_at) "
            "VALUES (?, 'default', 'issued', 0, 9000000000000, 0)",
            (f"tok{n}",),
        )
    c.execute("COMMIT")
    grouped = args.per_commit > 1
    begin, end = ("SAVEPOINT p", "RELEASE p") if grouped else ("BEGIN IMMEDIATE", "COMMIT")
    started = time.time()
    if grouped:
        c.execute("BEGIN IMMEDIATE")
    for n in range(args.count):
        if grouped and n and n % args.per_commit == 0:
            c.execute("COMMIT")
            c.execute("BEGIN IMMEDIATE")
        wf, body = f"payment:tok{n}", "y" * 300
        compensations = json.dumps(
            [
                {"seq": seq, "step_key": name, "name": name, "input": "null", "status": "registered"}
                for seq, name in enumerate(["store_response", "fail_record", "release_order", "refund"])
            ]
        )
        c.execute(begin)
        c.execute(
            "UPDATE idempotency_tokens SET state = 'in_use', fingerprint = 'f', route = '/v1/payments', "
            "updated_at = 1 WHERE token = ? AND tenant = 'default' AND state = 'issued'",
            (f"tok{n}",),
        )
        c.execute(
            "INSERT INTO payments (tenant, request_no, order_no, amount, currency, status, token, charge_id, "
            "decline_code, created_at, updated_at) VALUES ('default', ?, ?, 1000, 'CNY', 'processing', ?, NULL, "
            "NULL, 1, 1)",
            (f"r{n}", f"o{n}", f"tok{n}"),
        )
        c.execute(
            "UPDATE orders SET status = 'paying', version = version + 1, reserved_by = ? "
            "WHERE tenant = 'default' AND order_no = ?",
            (f"r{n}", f"o{n}"),
        )
        c.execute(
            "INSERT INTO workflows VALUES (?, 'payment', ?, 'h', 'running', NULL, NULL, 'owner', 2, 1, 1, 0, 1, 1, ?, 'default', NULL)",
            (wf, "x" * 300, compensations),
        )
        for seq, key in enumerate(["claim_token", "insert_record", "reserve_status", "call_channel"]):
            c.execute(
                "INSERT INTO workflow_steps VALUES (?, ?, ?, 'transactional', 'completed', 1, 'true', NULL, 1, 1, ?)",
                (wf, key, key, seq),
            )
        c.execute(end)
        c.execute(begin)
        c.execute(
            "UPDATE orders SET status = 'paid', version = version + 1 "
            "WHERE tenant = 'default' AND order_no = ? AND status = 'paying' AND reserved_by = ?",
            (f"o{n}", f"r{n}"),
        )
        c.execute(
            "UPDATE payments SET status = 'succeeded', charge_id = 'ch' WHERE tenant = 'default' AND request_no = ?",
            (f"r{n}",),
        )
        c.execute(
            "UPDATE idempotency_tokens SET state = 'completed', response_status = 201, response_body = ? "
            "WHERE token = ?",
            (body, f"tok{n}"),
        )
        c.execute(
            "INSERT INTO workflow_steps VALUES (?, 'confirm', 'confirm', 'transactional', 'completed', 1, ?, NULL, 1, 1, 4)",
            (wf, body),
        )
        c.execute(
            "UPDATE workflow_steps SET output = '{}' WHERE workflow_id = ? AND step_key = 'call_channel'", (wf,)
        )
        c.execute(
            "UPDATE workflows SET state = 'completed', output = ?, lease_owner = NULL "
            "WHERE workflow_id = ? AND lease_epoch = 1",
            (body, wf),
        )
        c.execute(end)
    if grouped:
        c.execute("COMMIT")
    elapsed = time.time() - started
    c.close()
    shutil.rmtree(os.path.dirname(path))
    print(f"{args.count / elapsed:.0f} payments/s ({elapsed / args.count * 1000:.3f} ms each), "
          f"{args.per_commit} payment(s) per commit")


if __name__ == "__main__":
    main()
