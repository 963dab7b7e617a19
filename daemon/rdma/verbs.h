// verbs.h: the C side of the rdma package's cgo files (verbs.go, cm.go):
// small helpers over rdma-core's libibverbs and librdmacm, included by
// each cgo preamble. Built only with the rdma tag (no .c file: the helpers
// are static, so each preamble has its own copy).
#ifndef T0_VERBS_H
#define T0_VERBS_H

#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>

static int t0_count_devices(void) {
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l) return -1;
	ibv_free_device_list(l);
	return n;
}

// t0_get_event waits up to ms for the next CM event.
static int t0_get_event(struct rdma_event_channel *ch, int ms, struct rdma_cm_event **ev) {
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	int r = poll(&p, 1, ms);
	if (r == 0) { errno = ETIMEDOUT; return -1; }
	if (r < 0) return -1;
	return rdma_get_cm_event(ch, ev);
}
static int t0_ev_type(struct rdma_cm_event *e) { return e->event; }
static int t0_ev_status(struct rdma_cm_event *e) { return e->status; }
static struct rdma_cm_id *t0_ev_id(struct rdma_cm_event *e) { return e->id; }
static int t0_ev_priv(struct rdma_cm_event *e, void *buf, int max) {
	int n = e->param.conn.private_data_len;
	if (!e->param.conn.private_data) return 0;
	if (n > max) n = max;
	memcpy(buf, e->param.conn.private_data, n);
	return n;
}

static void t0_sin(struct sockaddr_in *s, uint32_t ip, uint16_t port) {
	memset(s, 0, sizeof *s);
	s->sin_family = AF_INET;
	s->sin_addr.s_addr = htonl(ip);
	s->sin_port = htons(port);
}
static int t0_resolve_addr(struct rdma_cm_id *id, uint32_t ip, uint16_t port, int ms) {
	struct sockaddr_in s; t0_sin(&s, ip, port);
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&s, ms);
}
static int t0_bind_listen(struct rdma_cm_id *id, uint32_t ip, uint16_t port) {
	struct sockaddr_in s; t0_sin(&s, ip, port);
	if (rdma_bind_addr(id, (struct sockaddr *)&s)) return -1;
	return rdma_listen(id, 64);
}
static int t0_local_port(struct rdma_cm_id *id) {
	return ntohs(rdma_get_src_port(id));
}

struct t0_q {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	int qp;
};

// t0_setup creates the queue's PD, completion channel (non-blocking fd),
// CQ, RC QP and its one memory region; it returns the failed step (1..6)
// with errno set, or 0.
static int t0_setup(struct t0_q *q, struct rdma_cm_id *id, int depth, int rdmaops, void *buf, size_t len) {
	memset(q, 0, sizeof *q);
	q->id = id;
	if (!(q->pd = ibv_alloc_pd(id->verbs))) return 1;
	if (!(q->ch = ibv_create_comp_channel(id->verbs))) return 2;
	int fl = fcntl(q->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(q->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0) return 2;
	// every receive, send and RDMA READ/WRITE may complete at once
	if (!(q->cq = ibv_create_cq(id->verbs, 2 * depth + rdmaops + 8, NULL, q->ch, 0))) return 3;
	if (ibv_req_notify_cq(q->cq, 0)) return 4;
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = a.recv_cq = q->cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = depth + rdmaops + 2;
	a.cap.max_recv_wr = depth + 1;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, q->pd, &a)) return 5;
	q->qp = 1;
	if (!(q->mr = ibv_reg_mr(q->pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE))) return 6;
	return 0;
}

static void t0_teardown(struct t0_q *q) {
	if (q->qp) rdma_destroy_qp(q->id);
	if (q->mr) ibv_dereg_mr(q->mr);
	if (q->cq) ibv_destroy_cq(q->cq);
	if (q->ch) ibv_destroy_comp_channel(q->ch);
	if (q->pd) ibv_dealloc_pd(q->pd);
	memset(q, 0, sizeof *q);
}

static uint32_t t0_rkey(struct t0_q *q) { return q->mr->rkey; }

static int t0_conn_param(struct rdma_cm_id *id, struct rdma_conn_param *p, void *priv, int privlen) {
	struct ibv_device_attr d;
	memset(p, 0, sizeof *p);
	if (ibv_query_device(id->verbs, &d)) return -1;
	p->private_data = priv;
	p->private_data_len = privlen;
	p->responder_resources = d.max_qp_rd_atom > 255 ? 255 : d.max_qp_rd_atom;
	p->initiator_depth = d.max_qp_init_rd_atom > 255 ? 255 : d.max_qp_init_rd_atom;
	p->flow_control = 1;
	p->retry_count = 7;
	p->rnr_retry_count = 7;
	return 0;
}
static int t0_connect(struct rdma_cm_id *id, void *priv, int privlen) {
	struct rdma_conn_param p;
	if (t0_conn_param(id, &p, priv, privlen)) return -1;
	return rdma_connect(id, &p);
}
// t0_accept accepts with at most the RDMA READ depths the connecting side
// offered (ird: its responder resources, ord: its initiator depth).
static int t0_accept(struct rdma_cm_id *id, void *priv, int privlen, int ird, int ord) {
	struct rdma_conn_param p;
	if (t0_conn_param(id, &p, priv, privlen)) return -1;
	if (p.initiator_depth > ird) p.initiator_depth = ird;
	if (p.responder_resources > ord) p.responder_resources = ord;
	return rdma_accept(id, &p);
}
// In a CONNECT_REQUEST the depths are the passive side's view: initiator_depth
// is what it may use (the peer's responder resources).
static int t0_ev_ird(struct rdma_cm_event *e) { return e->param.conn.initiator_depth; }
static int t0_ev_ord(struct rdma_cm_event *e) { return e->param.conn.responder_resources; }
static int t0_peer(struct rdma_cm_id *id, char *buf, int n) {
	struct sockaddr *sa = rdma_get_peer_addr(id);
	if (!sa || sa->sa_family != AF_INET) return -1;
	struct sockaddr_in *s = (struct sockaddr_in *)sa;
	if (!inet_ntop(AF_INET, &s->sin_addr, buf, n)) return -1;
	return ntohs(s->sin_port);
}

// ibv_post_* return an errno value, not -1.
static int t0_post_recv(struct t0_q *q, uint64_t wr, void *addr, uint32_t len) {
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = q->mr->lkey };
	struct ibv_recv_wr w, *bad;
	memset(&w, 0, sizeof w);
	w.wr_id = wr; w.sg_list = &s; w.num_sge = 1;
	return ibv_post_recv(q->id->qp, &w, &bad);
}
static int t0_post_send(struct t0_q *q, uint64_t wr, int op, void *addr, uint32_t len, uint64_t raddr, uint32_t rkey) {
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = q->mr->lkey };
	struct ibv_send_wr w, *bad;
	memset(&w, 0, sizeof w);
	w.wr_id = wr; w.sg_list = &s; w.num_sge = 1;
	w.send_flags = IBV_SEND_SIGNALED;
	switch (op) {
	case 2: w.opcode = IBV_WR_SEND; break;
	case 3: w.opcode = IBV_WR_RDMA_READ; break;
	case 4: w.opcode = IBV_WR_RDMA_WRITE; break;
	default: return EINVAL;
	}
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(q->id->qp, &w, &bad);
}

struct t0_wc { uint64_t wr_id; uint32_t status; uint32_t byte_len; uint32_t vendor_err; };

// t0_wait waits up to ms for a completion event, re-arms the CQ and drains
// it into out (at most max). Arm-then-drain: a completion after the drain
// raises a new event. Returns the count or -1 with errno.
// cmfd (or -1) is the connection's CM event channel: *cmready is set when
// it has an event (a disconnect).
static int t0_wait(struct t0_q *q, int cmfd, int ms, struct t0_wc *out, int max, int *cmready) {
	*cmready = 0;
	if (ms > 0) {
		struct pollfd p[2] = { { .fd = q->ch->fd, .events = POLLIN }, { .fd = cmfd, .events = POLLIN } };
		int r = poll(p, cmfd >= 0 ? 2 : 1, ms);
		if (r < 0 && errno != EINTR) return -1;
		if (r > 0 && cmfd >= 0 && (p[1].revents & POLLIN)) *cmready = 1;
	}
	struct ibv_cq *cq; void *ctx; int got = 0;
	while (ibv_get_cq_event(q->ch, &cq, &ctx) == 0) got++;
	if (got) {
		ibv_ack_cq_events(q->cq, got);
		if (ibv_req_notify_cq(q->cq, 0)) return -1;
	}
	struct ibv_wc wc[32];
	int n = 0;
	while (n < max) {
		int want = max - n < 32 ? max - n : 32;
		int k = ibv_poll_cq(q->cq, want, wc);
		if (k < 0) { errno = EIO; return -1; }
		for (int i = 0; i < k; i++) {
			out[n].wr_id = wc[i].wr_id; out[n].status = wc[i].status;
			out[n].byte_len = wc[i].byte_len; out[n].vendor_err = wc[i].vendor_err;
			n++;
		}
		if (k < want) break;
	}
	return n;
}

#endif
