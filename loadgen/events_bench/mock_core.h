/* What the native mocks share (sse_mock.c, grpc_mock.c): one thread, epoll, a timerfd and a heap
 * of due events; reads stamped with the kernel's receive time; a connection's output queue; the
 * account of every event written (its lateness past its due time, the gaps between a stream's
 * events) written as JSON at SIGTERM. A mock supplies what it does with a connection's bytes and
 * with a due event (MockHandlers) and runs mock_main.
 *
 * Options every mock takes: --port N --port-file F --ttft-ms X --itl-ms Y --stats S. */
#ifndef MOCK_CORE_H
#define MOCK_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MAX_FD 65536

typedef struct {
    int64_t due_ns;
    int key; /* what is due: the mock's own (a connection's fd, a stream's slot) */
} Due;

typedef struct {
    char *data;
    size_t len, cap;
    int armed; /* waiting for EPOLLOUT */
} OutBuf;

typedef struct {
    const char *name;
    void (*accepted)(int ep, int fd);
    void (*readable)(int ep, int fd);        /* EPOLLIN, HUP or ERR */
    void (*writable)(int ep, int fd);        /* EPOLLOUT */
    void (*due)(int ep, Due d);              /* a pushed Due whose time came */
} MockHandlers;

extern int64_t ttft_ns, itl_ns;
extern uint64_t requests;

int64_t now_ns(void);

/* One read of fd into buf; *at_ns becomes when the kernel received its bytes (CLOCK_MONOTONIC)
 * where the kernel says. */
ssize_t read_stamped(int fd, char *buf, size_t len, int64_t *at_ns);

void push_due(int64_t due_ns, int key);

void out_queue(OutBuf *o, const void *data, size_t len);

/* Writes what o holds; what the socket does not take waits for EPOLLOUT. -1: the connection
 * broke (the caller closes it). */
int out_flush(int ep, int fd, OutBuf *o);

/* Counts one event written at at_ns for its due time: its lateness, and the gap since the
 * stream's previous event (last_ns; 0 for its first). */
void account_event(int64_t at_ns, int64_t due_ns, int64_t last_ns);

int mock_main(int argc, char **argv, const MockHandlers *h);

#endif
