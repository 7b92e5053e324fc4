package main

// notes follow the measured report in docs/benchmarks.md: how to read it,
// and what the profiles of one run showed. The figures quoted here are
// from the profiles named; the tables above them are from the run itself.
const notes = `
## Reading the numbers

- **API calls.** kube-apiserver counts requests by HTTP verb, so a create
  is a POST. Each operation makes the calls the contract allows: an acquire
  of a free lock, a renew and a release are one write each; an acquire that
  finds the lock taken (by another owner, or already by the caller) is one
  create that the API server refuses plus one GET; a semaphore acquire
  with room is a create of the owner's preferred slot plus one LIST; get
  is one LIST and check one GET. Creates and renews pass the mutating
  webhook once each; deletes pass no webhook. With token auth the route
  adds TokenReviews and SubjectAccessReviews, which the review cache
  shares among all calls of its lifetime (5 s by default): one TokenReview
  per token, one SubjectAccessReview per caller and verb.
- **Cycles.** A cycle makes the same two API calls as the Lease baseline
  (create, delete), plus one webhook call. On this machine every row is
  bound by CPU: kube-apiserver, etcd and the benchmark share two cores with
  other engineers' work, and the ratio of cycles per second follows the
  ratio of CPU per cycle. What separates the route from the baseline is
  now what each call costs, not how many calls there are.
- **The floor row** creates and deletes a copy of the QueenLock CRD that
  no webhook intercepts and no informer watches. It reaches only half to
  three quarters of a Lease's rate (by run and number of clients, in the
  runs of 2026-12-03): that is the price of a custom resource in
  kube-apiserver (JSON instead of protobuf, schema coercion, CEL rules,
  managed fields on unstructured objects, and the garbage all of that
  makes), and it bounds what any lock built on a CRD can reach here.
- **CPU per cycle** is the steadiest figure of a shared machine: other
  work slows every row, but changes little what one cycle costs each
  process. Read it beside the ratios.

## Where the time goes

CPU profiles of the 8-client rows and of the 1000-permit renew step
(` + "`go run ./bench -profile DIR`" + ` writes them; read them with
` + "`go tool pprof -top`" + `), from a run of 2026-12-03 09:20 UTC (load
average 6.5 at its start; the run above has its own profiles, not
summarised here). Figures are CPU
milliseconds per cycle or per renew.

- **kube-apiserver, per cycle:** Lease 2.4, CRD copy 4.6, route 5.7 (from
  the profiles' samples). The CRD copy over the Lease (+2.2): handling
  the request +1.0, of which schema coercion of unstructured JSON 0.6 and
  validation 0.3 (the CEL rules 0.16); decoding the etcd watch events of a
  JSON object, where a Lease's are protobuf, 0.4; garbage collection +0.5.
  The route over the CRD copy (+1.1): calling the mutating webhook 0.5,
  serving the manager's informer its watch 0.2, garbage collection +0.25.
- **The benchmark process, per cycle:** Lease 0.7, CRD copy 0.9, route 2.4
  (from /proc). In the route's profile: the locks client's two API calls
  (JSON both ways, HTTP/2 to the API server) 0.5, the manager's informer
  decoding the watch 0.2, the webhook server 0.2 and its TLS, the route's
  handler and the handle's HTTP client 0.15, garbage collection 0.15. The
  route's own hop is the difference between the route and direct rows of
  the last column: a few tenths of a millisecond.
- **A renew** (the 1000-permit step): kube-apiserver about 5.8 per renew.
  The guarded update itself 2.3: the merge patch applied to a JSON copy of
  the object 0.4, the webhook 0.5, validation with the CEL transition
  rules over the old and new object 0.6, schema decoding 0.4; garbage
  collection 1.2; the rest is the request's filters, authentication, TLS
  and HTTP/2. With etcd and the benchmark process, one renew costs 9 to 10
  ms of CPU: 2000 held permits renewing every 10 s (200 renews a second)
  would need about two cores, all of this machine, and the p99 of anything
  that queues for the last of a machine's CPU is long.

## What would close more

Nothing inside bench/ closes the gap. The changes made there measure more
fairly: route clients keep their connections alive (Go's default of two
idle connections per host made most calls at 8 and 32 clients open a new
one), rows take turns in one-second rounds, and CPU is counted per cycle.
What the profiles point at, for the owners of locks/, route/ and webhook/:

- **The mutating webhook on the route's own writes** is the largest cost
  the project controls: about half a millisecond of kube-apiserver CPU per
  create or renew (the AdmissionReview with the object, and on a renew the
  old object too, over TLS, and the patch applied back), a few tenths of a
  millisecond in the manager, and a round trip through a process that
  waits for CPU like the rest. A ` + "`matchConditions`" + ` rule on the
  webhook that leaves out the manager's own ServiceAccount, with the route
  stamping the three times from its clock (the manager's clock already
  judges expiry, and the skew grace covers its replicas) and the CRD's CEL
  rules still checking each transition, would save about a tenth of the
  CPU of a cycle and of a renew, and the round trip. It changes the contract's "client-sent
  times are never trusted" into "the manager's times are trusted", so it
  is a decision for the contract, not a tuning; and it does not reach 0.6
  alone.
- **The rest of the gap is the custom resource itself** (the floor row):
  kube-apiserver handles a QueenLock as unstructured JSON, where a Lease is
  protobuf and typed. Its schema coercion, CEL rules, managed fields and
  the garbage they make cost more than the Lease's whole create and
  delete. No client-side change removes that.
- **CBOR** (KEP-4222): the server side is the feature gate
  CBORServingAndStorage, still alpha and off by default in kube-apiserver
  v1.37.2, so no cluster a user runs has it. The clients here cannot use it
  either: controller-runtime v0.25's client builds its codecs from the
  scheme without the CBOR serializer, whatever client-go's ClientsAllowCBOR
  says; sending CBOR would mean building the route's client by hand.
  With the gate on for the server alone (the CRD copy's and the permits'
  storage, not the clients' requests), one run of the cycles on
  2026-12-03 09:14 UTC (load average about 13) showed no gain that stands
  out of the noise: kube-apiserver's CPU per cycle of the CRD copy and of
  the route stayed within the spread of the JSON runs of the same day.
  Nothing of it was kept but the benchmark's ` + "`-apiserver-feature-gates`" + `
  flag, to repeat the trial.

## Other rows

- The renew load rows show the latency of renews at a steady rate; the
  steps stop at the first whose p99 passes 250 ms.
- **Waking waiters.** A wake goes to one waiter per freed slot. Before
  the fix of 2026-12-03 a waiter that lost its try passed the wake on to
  the next, and the next, while the lock stayed held: every handoff set off
  a chain of creates that had to fail, and the handoff p50 was 54 ms. Now
  only a waiter whose limit reaches further gets a lost wake, and a
  semaphore waiter tries the slot that freed first; a handoff costs the
  watch event and one try (a create, and a list for a semaphore).
- Resident memory includes what the earlier rows allocated and the Go
  runtime has not yet returned, so it can even fall; the live heap after a
  collection is the figure that shows what 10,000 cached permits cost.
`
