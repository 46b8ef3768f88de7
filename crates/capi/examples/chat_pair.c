/*
 * chat_pair: one member of a secure group, through Conclave's C API.
 *
 *   chat_pair ENDPOINT NAME KEYS_DIR GROUP PEER [POLICY]
 *
 * Connects to the daemon at ENDPOINT as NAME with the identity in KEYS_DIR
 * (a key directory of `conclave keys`), joins GROUP (with POLICY if this
 * member creates it: tgdh by default), waits for a secure view that holds
 * PEER too, prints the membership, sends one message, waits until it has
 * both its own message back and one from PEER, prints what it received,
 * leaves and destroys the session. It starts nothing itself: a daemon must
 * be running, and PEER is another chat_pair (or a `conclave chat` member).
 *
 * Every line it prints starts with NAME. It exits 0 on success, 1 on a
 * failure (with the library's message) and 2 if nothing happened for 60 s.
 *
 * Build: cc -I crates/capi/include crates/capi/examples/chat_pair.c \
 *          -L target/debug -lconclave -Wl,-rpath,target/debug -o chat_pair
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conclave.h"

static const char *me = "?";

/* Prints a failed call with the library's message and exits. */
static void check(conclave_status_t rc, const char *what) {
    if (rc != CONCLAVE_OK) {
        fprintf(stderr, "%s: %s failed: %s: %s\n", me, what, conclave_status_name(rc), conclave_last_error());
        exit(1);
    }
}

static time_t deadline;

/* The next event, or exit if none comes before the deadline. */
static conclave_event_t *next_event(conclave_t *h) {
    for (;;) {
        conclave_event_t *ev = NULL;
        conclave_status_t rc = conclave_recv(h, 200, &ev);
        if (rc == CONCLAVE_OK) {
            conclave_event_kind_t kind = conclave_event_kind(ev);
            if (kind != CONCLAVE_EVENT_VIEW && kind != CONCLAVE_EVENT_MESSAGE && kind != CONCLAVE_EVENT_LEFT &&
                kind != CONCLAVE_EVENT_WAITING) {
                /* Refusals, rejected messages, daemon errors: say so, go on
                 * (who waits for the next rekey is no news here). */
                printf("%s: note: %s\n", me, conclave_event_text(ev));
            }
            if (kind == CONCLAVE_EVENT_CLOSED) {
                fprintf(stderr, "%s: %s\n", me, conclave_event_text(ev));
                exit(1);
            }
            return ev;
        }
        if (rc != CONCLAVE_TIMEOUT) {
            check(rc, "conclave_recv");
        }
        if (time(NULL) > deadline) {
            fprintf(stderr, "%s: nothing happened for 60 s\n", me);
            exit(2);
        }
    }
}

/* Whether a view event lists `name`. */
static int view_has(const conclave_event_t *ev, const char *name) {
    for (size_t i = 0; i < conclave_event_member_count(ev); i++) {
        if (strcmp(conclave_event_member(ev, i), name) == 0) {
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 7) {
        fprintf(stderr, "usage: %s ENDPOINT NAME KEYS_DIR GROUP PEER [POLICY]\n", argv[0]);
        return 1;
    }
    const char *endpoint = argv[1], *keys = argv[3], *group = argv[4], *peer = argv[5];
    const char *policy = argc == 7 ? argv[6] : NULL;
    me = argv[2];
    setvbuf(stdout, NULL, _IOLBF, 0);
    deadline = time(NULL) + 60;

    conclave_t *h = NULL;
    check(conclave_init(endpoint, me, keys, &h), "conclave_init");
    printf("%s: connected (%s)\n", me, conclave_version());
    check(conclave_join(h, group, policy), "conclave_join");

    /* Errors are return codes: joining twice is refused, and says why. */
    conclave_status_t again = conclave_join(h, group, policy);
    printf("%s: joining again: %s\n", me, conclave_status_name(again));

    /* Wait for a secure view with the peer in it. */
    for (;;) {
        conclave_event_t *ev = next_event(h);
        int done = conclave_event_kind(ev) == CONCLAVE_EVENT_VIEW && view_has(ev, peer);
        if (done) {
            printf("%s: secure view of %s (%s, %zu members)\n", me, conclave_event_group(ev),
                   conclave_event_protocol(ev), conclave_event_member_count(ev));
        }
        conclave_event_free(ev);
        if (done) {
            break;
        }
    }

    conclave_members_t *members = NULL;
    check(conclave_read_membership(h, group, &members), "conclave_read_membership");
    printf("%s: members:", me);
    for (size_t i = 0; i < conclave_members_count(members); i++) {
        printf(" %s", conclave_members_get(members, i));
    }
    printf("\n");
    conclave_members_free(members);

    char text[256];
    snprintf(text, sizeof text, "hello from %s", me);
    check(conclave_send(h, group, (const uint8_t *)text, strlen(text)), "conclave_send");

    /* Wait for our own message back and one from the peer. */
    int own = 0, from_peer = 0;
    while (!own || !from_peer) {
        conclave_event_t *ev = next_event(h);
        if (conclave_event_kind(ev) == CONCLAVE_EVENT_MESSAGE) {
            size_t len = 0;
            const uint8_t *data = conclave_event_data(ev, &len);
            const char *sender = conclave_event_sender(ev);
            printf("%s: received from %s: %.*s\n", me, sender, (int)len, (const char *)data);
            if (strcmp(sender, me) == 0) {
                own = 1;
            } else if (strcmp(sender, peer) == 0) {
                from_peer = 1;
            }
        }
        conclave_event_free(ev);
    }

    check(conclave_leave(h, group), "conclave_leave");
    for (;;) {
        conclave_event_t *ev = next_event(h);
        int left = conclave_event_kind(ev) == CONCLAVE_EVENT_LEFT;
        conclave_event_free(ev);
        if (left) {
            break;
        }
    }
    printf("%s: left %s\n", me, group);
    check(conclave_destroy(h), "conclave_destroy");
    return 0;
}
