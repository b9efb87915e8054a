-- approvals_answer: a person's plain yes or no to one approval, posted on its page, as one
-- statement (approvals/services.py, answer_at_once): on PostgreSQL the answer post's whole
-- work in one round trip after the session and the user, where approvals/services.py's
-- decide_answer takes four (the request's read, then the lock and the locked read, the event,
-- the settle and the audit with the COMMIT). It states decide_answer's rules for the common
-- answer, in the same order, and hands everything else back to it untouched ('python'):
--
-- 1. The request with its inbox and the person's role there, unlocked (get_visible's read,
--    approvals/models.py; the owner is a manager): 'unknown' (a 404) for a request they may
--    not see and one that does not exist alike. A viewer's answer (a 403 page) is 'python'.
-- 2. The inbox's lock, its lease row FOR UPDATE (lock_now.sql's), bounded by p_lock_timeout
--    as bounded_write bounds it; then the clock (p_now, else clock_timestamp(), read once the
--    lock is granted); then the request again, FOR UPDATE, with its answer event: the lease
--    row before the request, as every writer of an inbox takes them, so an answer and a
--    worker, a timer's expiry or a prune never wait on each other in opposite orders.
-- 3. What the answer does (services._decide): a question, a request of two approvers, one
--    with an edit already made, one whose deadline passed, an action shown with a first
--    letter beyond ASCII (capfirst's upper() is Python's): 'python', nothing written. A
--    request settled already (its row, or an answer event the row does not know): the
--    first outcome stands, the answer is audited as not counted.
-- 4. Otherwise the answer settles it: the answer event under its key ("approval",
--    request_id; the UNIQUE constraint decides, as store_event's), its trace when one is
--    given, the inbox's work marker lowered to it and the wake-up sent when it moved
--    (insert_one.sql's), the row settled (record_answer's UPDATE), the audit entry
--    (AuditEntry.record's). The live pages' change rows come from their triggers, as for
--    the ORM's writes.
--
-- The caller runs it as its own transaction (a savepoint inside a caller's), planned by
-- index (BY_INDEX before it, inbox/backends/postgresql.py: call), so a lock wait past the
-- bound rolls it back whole. Installed by approvals/migrations/0008_answer_in_one_statement.py;
-- a change here takes a migration that runs this file again (CREATE OR REPLACE).
CREATE OR REPLACE FUNCTION approvals_answer(
    p_user_id bigint,
    p_operator boolean,
    p_username text,
    p_name text,
    p_slug text,
    p_request_id text,
    p_answer text,
    p_via text,
    p_reasons jsonb,
    p_now timestamptz,
    p_lock_timeout text,
    p_channel text,
    p_trace text
) RETURNS TABLE (
    o_status text,
    o_result text,
    o_stands text,
    o_approval bigint,
    o_expires timestamptz,
    o_inbox bigint,
    o_event bigint,
    o_at timestamptz,
    o_payload jsonb
) LANGUAGE plpgsql AS $answer$
#variable_conflict use_column
DECLARE
    v_inbox bigint;
    v_role integer;
    v_operator boolean := coalesce(p_operator, false);
    a approvals_approval%ROWTYPE;
    v_stored jsonb;
    v_now timestamptz;
    v_reason text := '';
    v_shown text;
    v_first integer;
BEGIN
    IF p_answer NOT IN ('yes', 'no') THEN
        RAISE EXCEPTION 'approvals_answer: answer must be yes or no, not %', p_answer;
    END IF;
    SELECT ap.inbox_id,
        CASE WHEN i.owner_id = p_user_id THEN 3 ELSE (
            SELECT max(m.role) FROM inbox_membership AS m
            WHERE m.inbox_id = ap.inbox_id AND m.role >= 1
              AND (m.user_id = p_user_id OR m.group_id IN (
                  SELECT g.group_id FROM auth_user_groups AS g WHERE g.user_id = p_user_id))
        ) END
    INTO v_inbox, v_role
    FROM approvals_approval AS ap JOIN inbox_inbox AS i ON i.id = ap.inbox_id
    WHERE ap.inbox_id = (SELECT s.id FROM inbox_inbox AS s WHERE s.slug = p_slug)
      AND ap.request_id = p_request_id;
    IF NOT FOUND OR (v_role IS NULL AND NOT v_operator) THEN
        o_status := 'unknown';
        RETURN NEXT;
        RETURN;
    END IF;
    IF NOT v_operator AND v_role < 2 THEN
        o_status := 'python';
        RETURN NEXT;
        RETURN;
    END IF;

    IF p_lock_timeout IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout, true);
    END IF;
    PERFORM 1 FROM inbox_lease AS l WHERE l.inbox_id = v_inbox FOR UPDATE;
    IF NOT FOUND THEN
        o_status := 'python';
        RETURN NEXT;
        RETURN;
    END IF;
    v_now := coalesce(p_now, clock_timestamp());
    SELECT * INTO a FROM approvals_approval AS ap
    WHERE ap.inbox_id = v_inbox AND ap.request_id = p_request_id
    FOR UPDATE;
    IF NOT FOUND THEN
        -- Pruned since the first read: decide_answer's "unknown", told as settled.
        o_status := 'done';
        o_stands := 'unknown';
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT e.payload INTO v_stored FROM inbox_event AS e
    WHERE e.inbox_id = v_inbox AND e.source = 'approval' AND e.source_id = a.request_id;

    v_first := ascii(left(a.action, 1));
    IF jsonb_typeof(a.details -> 'question') = 'object' OR v_first > 127 THEN
        o_status := 'python';
        RETURN NEXT;
        RETURN;
    END IF;
    v_shown := CASE WHEN v_first BETWEEN 97 AND 122
        THEN chr(v_first - 32) || substr(a.action, 2) ELSE a.action END;
    IF p_answer = 'no' THEN
        v_reason := coalesce(p_reasons ->> a.id::text, '');
    END IF;
    o_approval := a.id;
    o_expires := a.expires_at;
    o_inbox := v_inbox;
    o_at := v_now;
    o_status := 'done';

    IF a.answer <> '' OR v_stored IS NOT NULL THEN
        o_result := 'already_settled';
        o_stands := CASE WHEN a.answer <> '' THEN a.answer ELSE v_stored ->> 'answer' END;
    ELSIF v_now >= a.expires_at OR a.approvers_needed <> 1 OR a.edited_arguments IS NOT NULL THEN
        o_status := 'python';
        RETURN NEXT;
        RETURN;
    ELSE
        o_payload := jsonb_build_object(
            'approval', a.request_id,
            'answer', p_answer,
            'action', a.action,
            'approvers_needed', a.approvers_needed,
            'answered_by', p_username,
            'approved_by', CASE WHEN p_answer = 'yes'
                THEN jsonb_build_array(p_username) ELSE '[]'::jsonb END,
            'names', jsonb_build_object(p_username, p_name)
        );
        IF v_reason <> '' THEN
            o_payload := o_payload || jsonb_build_object('reason', v_reason);
        END IF;
        INSERT INTO inbox_event (inbox_id, source, source_id, payload, status, attempts,
                                 claim_gen, error, available_at, created, updated)
        VALUES (v_inbox, 'approval', a.request_id, o_payload, 'pending', 0, NULL, '',
                v_now, v_now, v_now)
        ON CONFLICT (inbox_id, source, source_id) DO NOTHING
        RETURNING id INTO o_event;
        IF o_event IS NULL THEN
            -- Stored by a writer that did not take the lock: its answer stands.
            SELECT e.payload ->> 'answer' INTO o_stands FROM inbox_event AS e
            WHERE e.inbox_id = v_inbox AND e.source = 'approval' AND e.source_id = a.request_id;
            o_result := 'already_settled';
            o_payload := NULL;
        ELSE
            o_result := CASE WHEN p_answer = 'yes' THEN 'approved' ELSE 'denied' END;
            o_stands := p_answer;
            IF coalesce(p_trace, '') <> '' THEN
                INSERT INTO inbox_eventtrace (event_id, traceparent) VALUES (o_event, p_trace);
            END IF;
            UPDATE inbox_lease AS l SET work_at = v_now
            WHERE l.inbox_id = v_inbox AND (l.work_at IS NULL OR l.work_at > v_now);
            IF FOUND THEN
                PERFORM pg_notify(p_channel, v_inbox::text);
            END IF;
            -- By its key alone: the row is locked above and unanswered (a.answer = '').
            -- With "AND answer = ''" as well, the planner may take approval_waiting_idx,
            -- whose predicate that matches, and read every waiting approval for the id.
            UPDATE approvals_approval AS ap
            SET answer = p_answer, answered_at = v_now, reason = v_reason, reply = '',
                answered_by_id = p_user_id
            WHERE ap.id = a.id;
        END IF;
    END IF;

    INSERT INTO approvals_auditentry (approval_id, inbox_id, user_id, username, answer, via,
                                      result, action_shown, edited_arguments, reason, reply, at)
    VALUES (a.id, v_inbox, p_user_id, p_username, p_answer, p_via, o_result, v_shown, NULL,
            v_reason, '', v_now);
    RETURN NEXT;
END;
$answer$;
