"""Brute-force model of Megatron-LM core_v0.19.0's initialize_model_parallel.

Written from the original's megatron/core/parallel_state.py (read, not
copied): the RankGenerator with its order handling (the injected "gtp_remat"
axis, the substring test of missing names, lower-casing), the masked
orthogonal rank groups enumerated group by group and rank by rank, then the
groups created in the original's order with every rank keeping the ones it is
in, exactly as the module globals end up, and the getters read from those
globals. Nothing here shares code or arithmetic with mpu's C layout (which
solves the same groups as mesh slices), so agreement is a real check.

GTP/EGTP remat sizes are 1 (not asked for), as are SHARP and hybrid cp.
"""


class Refused(Exception):
    """What the original raises: kind is the Python exception's name."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


def _prefix_product(a):
    r, acc = [1], 1
    for v in a:
        acc *= v
        r.append(acc)
    return r


def _decompose(index, shape):
    stride = _prefix_product(shape)
    idx = [(index // d) % s for s, d in zip(shape, stride)]
    if sum(x * y for x, y in zip(idx, stride[:-1])) != index:
        raise Refused("AssertionError", f"idx {idx} with shape {shape} mismatch the return idx")
    return idx


def _masked_groups(world_size, parallel_size, mask):
    masked = [s for s, m in zip(parallel_size, mask) if m]
    unmasked = [s for s, m in zip(parallel_size, mask) if not m]
    stride = _prefix_product(parallel_size)
    m_stride = [d for d, m in zip(stride, mask) if m]
    u_stride = [d for d, m in zip(stride, mask) if not m]
    group_size = _prefix_product(masked)[-1]
    groups = []
    for g in range(world_size // group_size):
        gi = _decompose(g, unmasked)
        base = sum(x * y for x, y in zip(gi, u_stride))
        group = []
        for r in range(group_size):
            ri = _decompose(r, masked)
            group.append(sum(x * y for x, y in zip(ri, m_stride)) + base)
        groups.append(group)
    return groups


def _inject_gtp(order, after):
    toks = order.split("-")
    anchor = after if after in toks else "tp"
    pos = toks.index(anchor) + 1 if anchor in toks else 0
    toks.insert(pos, "gtp_remat")
    return "-".join(toks)


class _Generator:
    def __init__(self, tp, ep, dp, pp, cp, order, offset):
        self.sizes = {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "cp": cp, "gtp_remat": 1}
        self.world = tp * dp * pp * cp * ep
        self.offset = offset
        low = order.lower()
        for name, size in self.sizes.items():
            if name not in low and size != 1:
                raise Refused(
                    "RuntimeError",
                    f"The size of ({name}) is ({size}), but you haven't"
                    f"specified the order ({order}).",
                )
            if name not in low:
                low = low + "-" + name
        self.tokens = low.split("-")
        self.ordered = []
        for t in self.tokens:
            if t not in self.sizes:
                raise Refused("KeyError", repr(t))
            self.ordered.append(self.sizes[t])

    def ranks(self, token):
        mask = [False] * len(self.tokens)
        for t in token.split("-"):
            if t not in self.tokens:
                raise Refused("ValueError", f"'{t}' is not in list")
            mask[self.tokens.index(t)] = True
        groups = _masked_groups(self.world, self.ordered, mask)
        if self.offset > 0:
            groups = [[r + self.offset for r in g] for g in groups]
        return groups


def _hierarchical(ranks, sizes):
    """einops "(l s u) -> (l u) s" for each level."""
    levels = []
    for level in range(len(sizes)):
        u = 1
        for s in sizes[:level]:
            u *= s
        lo = 1
        for s in sizes[level + 1:]:
            lo *= s
        s = sizes[level]
        subs = []
        for li in range(lo):
            for ui in range(u):
                subs.append([ranks[(li * s + si) * u + ui] for si in range(s)])
        levels.append(subs)
    return levels


def initialize(world_size, tp=1, pp=1, vp=None, cp=1, hcp=None, ep=1, dist_opt=1, etp=None,
               order="tp-cp-ep-dp-pp", gloo=True, rank_offset=0, local_world_size=None):
    """Every group the original creates, in creation order: a list of
    (kind, ranks, stored) and the layout sizes. Raises Refused."""
    W = local_world_size if local_world_size is not None else world_size
    model = tp * pp * cp
    if W % model != 0:
        raise Refused("RuntimeError", f"world_size ({W}) is not divisible by {model}")
    dp = W // model
    if vp is not None and not pp > 1:
        raise Refused("RuntimeError", "pipeline-model-parallel size should be greater than 1 "
                      "with interleaved schedule")
    dense = _Generator(tp, 1, dp, pp, cp, _inject_gtp(order, "tp"), rank_offset)
    if etp is None:
        etp = tp
    etpp = etp * ep * pp
    edp = W // etpp
    if W % etpp != 0:
        raise Refused("RuntimeError", f"world_size ({W}) is not divisible by "
                      f"expert_tensor_model_pipeline_parallel size ({etpp})")
    expert = _Generator(etp, ep, edp, pp, 1, _inject_gtp(order, "ep"), rank_offset)
    if not (order.endswith("pp") or pp == 1 or edp == dp):
        raise Refused("AssertionError", "When not using pp-last rank ordering, the data "
                      "parallel size of the attention and moe layers must be the same")
    if dense.ranks("pp") != expert.ranks("pp"):
        raise Refused("AssertionError", "Pipeline parallel groups are expected to be the same")
    if (dp * cp) % dist_opt != 0:
        raise Refused("AssertionError", "Data parallel size should be divisible by partial "
                      "DistOpt shard factor")
    intra_dp_cp = dp * cp // dist_opt
    made = []

    def create(kind, ranks, stored=True):
        for r in ranks:
            if r < 0 or r >= world_size:
                raise Refused("ValueError", "The new group's rank should be within the "
                              "world_size set by init_process_group")
        made.append((kind, sorted(ranks), stored))

    for g in dense.ranks("gtp_remat"):
        create("gtp", g, stored=False)
    for g in dense.ranks("dp-cp"):
        create("dp_cp", g)
        if gloo:
            create("dp_cp_gloo", g)
        if dist_opt > 1:
            for i in range(dist_opt):
                share = g[i * intra_dp_cp:(i + 1) * intra_dp_cp]
                create("intra_partial_dp_cp", share)
                if gloo:
                    create("intra_partial_dp_cp_gloo", share)
    for g in dense.ranks("dp"):
        create("dp", g)
        if gloo:
            create("dp_gloo", g)
    for g in dense.ranks("cp"):
        create("cp", g)
        if hcp:
            p = 1
            for s in hcp:
                p *= s
            if p != cp:
                raise Refused("AssertionError", "")
            for level, subs in enumerate(_hierarchical(g, hcp)):
                for sub in subs:
                    create(f"hcp_l{level}", sub)
    for g in dense.ranks("tp-gtp_remat-pp"):
        create("mp", g)
    for g in dense.ranks("tp"):
        create("tp", g)
    for g in dense.ranks("pp"):
        create("pp", g)
        create("embedding", [g[0]] if len(g) == 1 else [g[0], g[-1]])
        create("position_embedding", [g[0]])
    for g in dense.ranks("tp-gtp_remat-dp-cp"):
        create("tp_dp_cp", g)
    for g in dense.ranks("tp-gtp_remat-dp"):
        create("tp_dp", g)
    for g in dense.ranks("tp-cp"):
        create("tp_cp", g)
    for g in expert.ranks("gtp_remat"):
        create("egtp", g, stored=False)
    for g in expert.ranks("ep"):
        create("ep", g)
    for g in expert.ranks("tp"):
        create("etp", g)
    for g in expert.ranks("tp-ep"):
        create("etp_ep", g)
    for g in expert.ranks("tp-ep-pp"):
        create("etp_ep_pp", g)
    for g in expert.ranks("tp-ep-gtp_remat-pp"):
        create("etp_ep_pp_egtp", g, stored=False)
    if edp % dist_opt != 0:
        raise Refused("AssertionError", "Expert data parallel size should be divisible by "
                      "partial DistOpt shard factor")
    intra_edp = edp // dist_opt
    for g in expert.ranks("dp"):
        create("edp", g)
        if gloo:
            create("edp_gloo", g)
        if dist_opt > 1:
            levels = _hierarchical(g, [intra_edp, dist_opt])
            for sub in levels[0]:
                create("intra_partial_edp", sub)
                if gloo:
                    create("intra_partial_edp_gloo", sub)
            for sub in levels[1]:
                create("inter_partial_edp", sub)
                if gloo:
                    create("inter_partial_edp_gloo", sub, stored=False)
    acc, count = [], 0
    for g in expert.ranks("tp-ep-pp"):
        count += 1
        acc.extend(g)
        if count % intra_edp == 0:
            create("intra_dist_opt_instance", acc)  # unsorted here; torch sorts
            acc = []
    if dist_opt == 1:  # the original assigns the full groups to the partial globals
        for kind, twin in (("intra_partial_dp_cp", "dp_cp"), ("intra_partial_edp", "edp"),
                           ("intra_partial_dp_cp_gloo", "dp_cp_gloo"),
                           ("intra_partial_edp_gloo", "edp_gloo")):
            made.extend((kind, g, True) for k, g, _ in list(made) if k == twin)
    return made, {"dp": dp, "edp": edp, "etp": etp}


def per_rank(world_size, made, vp):
    """What each rank's getters answer (None where the original has None or
    asserts), from the groups it keeps."""
    mine = [dict() for _ in range(world_size)]
    for kind, g, stored in made:
        if stored:
            for r in g:
                mine[r][kind] = g
    out = []
    for r in range(world_size):
        m = mine[r]

        def rank_in(kind):
            return m[kind].index(r) if kind in m else None

        def size_of(kind):
            return len(m[kind]) if kind in m else None

        def src_of(kind):
            return m[kind][0] if kind in m else None

        pipe = m.get("pp")
        x = {"rank": r,
             "tp_rank": rank_in("tp"), "tp_size": size_of("tp"), "tp_src": src_of("tp"),
             "pp_rank": rank_in("pp"), "pp_size": size_of("pp"),
             "pp_first": pipe[0] if pipe else None, "pp_last": pipe[-1] if pipe else None,
             "pp_next": pipe[(pipe.index(r) + 1) % len(pipe)] if pipe else None,
             "pp_prev": pipe[(pipe.index(r) - 1) % len(pipe)] if pipe else None,
             "is_first_stage": pipe.index(r) == 0 if pipe else None,
             "is_last_stage": pipe.index(r) == len(pipe) - 1 if pipe else None,
             "vp_rank": 0 if vp is not None else None, "vp_size": vp,
             "dp_rank": rank_in("dp"), "dp_size": size_of("dp"), "dp_src": src_of("dp"),
             "dp_cp_rank": rank_in("dp_cp"), "dp_cp_size": size_of("dp_cp"),
             "dp_cp_src": src_of("dp_cp"),
             "partial_dp_cp_rank": rank_in("intra_partial_dp_cp"),
             "partial_dp_cp_size": size_of("intra_partial_dp_cp"),
             "replica_dp_rank": rank_in("dp"), "replica_dp_size": size_of("dp"),
             "replica_dp_cp_rank": rank_in("dp_cp"), "replica_dp_cp_size": size_of("dp_cp"),
             "cp_rank": rank_in("cp"), "cp_size": size_of("cp"),
             "cp_global_ranks": m.get("cp")}
        levels = sorted(k for k in m if k.startswith("hcp_l"))
        x["hcp_groups"] = [m[k] for k in levels] if levels else None
        for key, kind in (("tp_cp", "tp_cp"), ("mp", "mp"), ("tp_dp", "tp_dp"),
                          ("tp_dp_cp", "tp_dp_cp"), ("ep", "ep"), ("etp", "etp"),
                          ("etp_ep", "etp_ep"), ("etp_ep_pp", "etp_ep_pp"), ("edp", "edp"),
                          ("partial_edp", "intra_partial_edp"), ("replica_edp", "edp"),
                          ("intra_dist_opt", "intra_dist_opt_instance"),
                          ("inter_dist_opt", "inter_partial_edp")):
            x[key + "_rank"] = rank_in(kind)
            x[key + "_size"] = size_of(kind)
            if key in ("mp", "ep"):
                x[key + "_src"] = src_of(kind)
        x["embedding_global_ranks"] = m.get("embedding")
        x["in_embedding_group"] = "embedding" in m
        x["position_embedding_global_ranks"] = m.get("position_embedding")
        x["in_position_embedding_group"] = "position_embedding" in m
        out.append(x)
    return out


def groups_by_kind(made):
    """Each kind's distinct groups (sorted) as a set of tuples, stored kinds only."""
    kinds = {}
    for kind, g, stored in made:
        if stored:
            kinds.setdefault(kind, set()).add(tuple(g))
    return kinds
