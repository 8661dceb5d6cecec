"""A Kubernetes API emulator for the end-to-end tests: kmock's, made real enough for kube-rs.

kmock 0.8's KubernetesEmulator stores objects as given. This subclass adds what a
kube-rs Controller relies on: metadata.resourceVersion, uid, generation,
creationTimestamp and namespace on every create and patch; a counter as the list's
resourceVersion (kmock returns "..."); the NotFound/AlreadyExists reasons that kube's
error helpers look for; and a server-side apply of a missing object as a create. It can also black-hole every request whose path names an
object, as if the API server had lost it, until told to release it:

    POST /_emulator/black-hole/NAME   hold every later request whose path names NAME
    POST /_emulator/release/NAME      answer the held requests, and those to come

For mass failures and outages, it can also hold many requests at once, each
an awaited event (no thread, no timer), so that holding hundreds costs nothing:

    POST /_emulator/hold-prefix/PREFIX     hold every later request with a path segment
                                           starting with PREFIX (e.g. 150 objects mass-*)
    POST /_emulator/release-prefix/PREFIX  answer them, and those to come
    POST /_emulator/outage/start           answer nothing at all (discovery and /version
                                           included) but these controls
    POST /_emulator/outage/end             answer everything held by the outage
Watches carry a BOOKMARK event every --bookmark-every seconds (1 by default;
a real API server sends one about every minute, kmock none), and can be held:

    POST /_emulator/hold-watches/all       every watch, open or new, delivers nothing (no
                                           response head for a new one, no event, no
                                           bookmark) until released
    POST /_emulator/release-watches/all    they deliver again

Events (events.k8s.io/v1) are stored like any object; every write to them
(POST or PATCH, held or not) is counted as it arrives:

    GET /_emulator/event-writes            how many, as a decimal number

Leases (coordination.k8s.io/v1) and ConfigMaps have optimistic concurrency, as leader
election and the quarantine's ledger need: a create of an existing one is 409
AlreadyExists, and a patch whose body carries a metadata.resourceVersion other than the
stored one is 409 Conflict (checked and written under one lock, so of two racing writers
exactly one wins), as on a real server.

Usage: python emulator.py [--port PORT] [--bookmark-every SECONDS]; it prints one line, "listening on URL", when
it accepts connections, and runs until killed.
"""

import argparse
import asyncio
import datetime
import sys
import uuid

import aiohttp.web
import attrs
import kmock

CONTROL_PREFIX = '/_emulator/'

RESOURCES = {
    'watchdog.example.com/v1/configtemplates': kmock.ResourceInfo(
        kind='ConfigTemplate', namespaced=True, subresources={'status'},
        verbs={'get', 'list', 'watch', 'create', 'patch', 'delete'}),
    'v1/configmaps': kmock.ResourceInfo(
        kind='ConfigMap', namespaced=True,
        verbs={'get', 'list', 'watch', 'create', 'patch', 'delete'}),
    # Leader election (`run --leader-elect`): read, create, and patch with a
    # resourceVersion precondition (see Leases below).
    'coordination.k8s.io/v1/leases': kmock.ResourceInfo(
        kind='Lease', namespaced=True,
        verbs={'get', 'list', 'watch', 'create', 'patch', 'delete'}),
    # Hang Events (`run --hang-events`): created, and patched as a series repeats.
    'events.k8s.io/v1/events': kmock.ResourceInfo(
        kind='Event', namespaced=True,
        verbs={'get', 'list', 'watch', 'create', 'patch', 'delete'}),
    # What the tests' real-cluster set-up touches, so that it can run against this too.
    'apiextensions.k8s.io/v1/customresourcedefinitions': kmock.ResourceInfo(
        kind='CustomResourceDefinition', namespaced=False,
        verbs={'get', 'list', 'watch', 'create', 'patch', 'delete'}),
}

REASONS = {404: 'NotFound', 409: 'AlreadyExists'}


class Gate:
    """Open, or closed: while closed, whoever passes waits until it opens again."""

    def __init__(self) -> None:
        self._closed: asyncio.Event | None = None

    def close(self) -> None:
        if self._closed is None:
            self._closed = asyncio.Event()

    def open(self) -> None:
        if self._closed is not None:
            self._closed.set()
            self._closed = None

    async def passed(self) -> None:
        while self._closed is not None:
            await self._closed.wait()


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    _revision: int = attrs.field(default=0, init=False)
    # Object name -> the event its held requests wait on.
    _holes: dict[str, asyncio.Event] = attrs.field(factory=dict, init=False)
    # Name prefix -> the event its held requests wait on (hold-prefix).
    _held_prefixes: dict[str, asyncio.Event] = attrs.field(factory=dict, init=False)
    # Closed while the whole server is out: every request waits at it.
    _outage: Gate = attrs.field(factory=Gate, init=False)
    # Leases and ConfigMaps: one writer at a time from the resourceVersion check to the store.
    _lease_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    # Seconds between two bookmarks on an open watch.
    bookmark_every: float = 1.0
    # Closed while watches are held: every watch waits at it before it delivers.
    _watches: Gate = attrs.field(factory=Gate, init=False)
    # Writes (POST, PATCH) to events.k8s.io Events so far, counted as they arrive.
    _event_writes: int = attrs.field(default=0, init=False)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if not raw_request.path.startswith(CONTROL_PREFIX):
            if (raw_request.path.startswith('/apis/events.k8s.io/')
                    and raw_request.method in ('POST', 'PATCH')):
                self._event_writes += 1
            await self._wait_out_holds(raw_request.path)
        # kmock 0.8 cannot parse /api/v1/namespaces (it reads "namespaces" as the start of
        # a namespaced path), so namespaces are answered here: accepted, never stored.
        if raw_request.path.startswith('/api/v1/namespaces') and raw_request.path.count('/') <= 4:
            if raw_request.method == 'POST':
                body = await raw_request.json()
                body.setdefault('metadata', {})['uid'] = str(uuid.uuid4())
                return aiohttp.web.json_response(body, status=201)
            if raw_request.method == 'DELETE':
                return aiohttp.web.json_response({'kind': 'Status', 'status': 'Success'})
        return await super().__call__(raw_request)

    def _next_revision(self) -> str:
        self._revision += 1
        return str(self._revision)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            return await self._handle_stamped(request)
        finally:
            self._forget(request)

    def _forget(self, request: kmock.Request) -> None:
        """Drops a served request from kmock's history of every request.

        kmock keeps every request for assertions and matches each new one against its
        reactions by scanning that whole history: quadratic, a dozen requests a second
        after a few thousand. The tests assert on the operator, not on this history, so
        only requests still being served stay in it (a reaction needs its own request
        there while it is matched)."""
        requests = self._requests
        for index in range(len(requests) - 1, -1, -1):
            if requests[index] is request:
                del requests[index]
                return

    async def _handle_stamped(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        path = request.url.path
        if path.startswith(CONTROL_PREFIX):
            return self._control(request, path[len(CONTROL_PREFIX):])
        # A copy: a release removes its hole while held requests still iterate.
        for name, released in list(self._holes.items()):
            if name in path.split('/'):
                await released.wait()
        if _is_versioned_write(request) and not self._creates_by_apply(request):
            async with self._lease_lock:
                conflict = self._stale_lease_version(request)
                if conflict is not None:
                    return conflict
                self._stamp(request)
                return await super()._handle(request)
        if self._creates_by_apply(request):
            # Stored as a create; kmock's routing has no reaction for a PATCH that
            # creates, so the answer is made here.
            request = attrs.evolve(request, action=kmock.action.CREATE)
            self._stamp(request)
            try:
                return await super()._handle(request)
            except NotImplementedError:
                key = (request.resource, request.namespace, request.name)
                return aiohttp.web.json_response(self.objects[key].raw, status=201)
        self._stamp(request)
        return await super()._handle(request)

    def _creates_by_apply(self, request: kmock.Request) -> bool:
        """A server-side apply of a missing object creates it, as on a real server."""
        content_type = request.headers.get('Content-Type', '')
        if request.action != kmock.action.UPDATE or 'apply-patch' not in content_type:
            return False
        key = (request.resource, request.namespace, request.name)
        return key not in self.objects or self.objects[key].deleted

    async def _wait_out_holds(self, path: str) -> None:
        """Holds a request while the server is out, or while its path names a held prefix."""
        await self._outage.passed()
        for prefix, released in list(self._held_prefixes.items()):
            if any(segment.startswith(prefix) for segment in path.split('/')):
                await released.wait()

    def _control_holds(self, verb: str, name: str) -> aiohttp.web.StreamResponse | None:
        """The hold-prefix, release-prefix and outage commands; None for others."""
        if verb == 'hold-prefix':
            self._held_prefixes.setdefault(name, asyncio.Event())
        elif verb == 'release-prefix':
            self._held_prefixes.pop(name, asyncio.Event()).set()
        elif verb == 'outage' and name == 'start':
            self._outage.close()
        elif verb == 'outage' and name == 'end':
            self._outage.open()
        elif verb == 'hold-watches' and name == 'all':
            self._watches.close()
        elif verb == 'release-watches' and name == 'all':
            self._watches.open()
        else:
            return None
        return aiohttp.web.Response(text=f'{verb} {name}\n')

    def _control(self, request: kmock.Request, command: str) -> aiohttp.web.StreamResponse:
        verb, _, name = command.partition('/')
        if request.method == kmock.method.GET and command == 'event-writes':
            return aiohttp.web.Response(text=f'{self._event_writes}\n')
        if request.method == kmock.method.POST and name:
            answered = self._control_holds(verb, name)
            if answered is not None:
                return answered
        if request.method != kmock.method.POST or not name:
            return aiohttp.web.Response(status=400, text=f'unknown command {command!r}\n')
        if verb == 'black-hole':
            self._holes.setdefault(name, asyncio.Event())
        elif verb == 'release':
            self._holes.pop(name, asyncio.Event()).set()
        else:
            return aiohttp.web.Response(status=400, text=f'unknown command {command!r}\n')
        return aiohttp.web.Response(text=f'{verb} {name}\n')

    def _stamp(self, request: kmock.Request) -> None:
        """Adds the server-owned metadata to a create or patch before kmock stores it."""
        if not isinstance(request.data, dict):
            return
        meta = request.data.setdefault('metadata', {})
        if not isinstance(meta, dict):
            return
        if request.action == kmock.action.CREATE:
            now = datetime.datetime.now(tz=datetime.UTC)
            meta['uid'] = str(uuid.uuid4())
            meta['generation'] = 1
            meta['creationTimestamp'] = now.strftime('%Y-%m-%dT%H:%M:%SZ')
            if request.namespace and not meta.get('namespace'):
                meta['namespace'] = request.namespace
            meta['resourceVersion'] = self._next_revision()
        elif request.action == kmock.action.UPDATE and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            current = self.objects[key] if key in self.objects else None
            if current is None or current.deleted:
                return  # kmock answers 404
            # The spec changed: a new generation, as a real server counts them.
            if request.subresource is None and 'spec' in request.data:
                generation = current.get('metadata', {}).get('generation', 1)
                meta['generation'] = generation + 1
            meta['resourceVersion'] = self._next_revision()

    # Leases and ConfigMaps ------------------------------------------------------------

    def _stale_lease_version(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """409 Conflict for a patch that names a resourceVersion the object no longer has."""
        if request.action != kmock.action.UPDATE or not isinstance(request.data, dict):
            return None
        meta = request.data.get('metadata')
        wanted = meta.get('resourceVersion') if isinstance(meta, dict) else None
        if wanted is None:
            return None  # no precondition: the write wins, as on a real server
        key = (request.resource, request.namespace, request.name)
        if key not in self.objects or self.objects[key].deleted:
            return None  # kmock answers 404
        stored = self.objects[key].get('metadata', {}).get('resourceVersion')
        if str(wanted) == str(stored):
            return None
        group = getattr(request.resource, 'group', None) or ''
        plural = getattr(request.resource, 'plural', None) or ''
        qualified = f'{plural}.{group}' if group else plural
        message = (f'Operation cannot be fulfilled on {qualified} "{request.name}": '
                   'the object has been modified; please apply your changes to the latest version '
                   'and try again')
        return aiohttp.web.json_response({
            'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
            'message': message, 'reason': 'Conflict', 'code': 409,
            'details': {'name': request.name, 'group': group, 'kind': plural},
        }, status=409)

    # Watches ----------------------------------------------------------------------------

    async def _serve_watch(self, request: kmock.Request):
        """A watch as kmock serves it (every existing object ADDED, then every change),
        with a BOOKMARK whenever it has been quiet for bookmark_every seconds, and nothing
        at all while watches are held.

        Unlike kmock 0.8, it subscribes to the changes *before* listing the objects, so
        that an object created between the two is not lost (it may come twice, as a real
        watch may deliver it; kube's watcher applies both)."""
        await self._watches.passed()
        yield b''  # the response head (kmock sends it with the first chunk)
        resource = request.resource
        bus = self._buses[resource]
        marker = await bus.mark()
        try:
            async with self._lock:
                # kmock's own (name-mangled) helpers: the objects this request selects.
                objs = self._KubernetesEmulator__get_objs(request, strict=False)
                events = [{'type': 'ADDED', 'object': obj.raw} for obj in objs if not obj.deleted]
            for event in events:
                await self._watches.passed()
                yield event
            changes = bus.stream(since=marker).__aiter__()
            bookmark = self._bookmark(resource)
            pending = asyncio.ensure_future(changes.__anext__())
            try:
                while True:
                    done, _ = await asyncio.wait({pending}, timeout=self.bookmark_every)
                    await self._watches.passed()
                    if pending not in done:
                        bookmark['object']['metadata']['resourceVersion'] = str(self._revision)
                        yield bookmark
                        continue
                    try:
                        event = pending.result()
                    except StopAsyncIteration:
                        return
                    pending = asyncio.ensure_future(changes.__anext__())
                    meta = event.get('object', {}).get('metadata', {})
                    if self._KubernetesEmulator__check(request, resource, meta.get('namespace'),
                                                       meta.get('name'), strict=False):
                        yield event
            finally:
                pending.cancel()
        finally:
            try:
                await bus.unmark(marker)
            except Exception:  # the loop may be closing: nothing left to unmark from
                pass

    @staticmethod
    def _bookmark(resource) -> dict:
        group = getattr(resource, 'group', None) or ''
        version = getattr(resource, 'version', None) or 'v1'
        plural = getattr(resource, 'plural', None)
        kind = next((info.kind for key, info in RESOURCES.items()
                     if key.rsplit('/', 1)[-1] == plural), 'Unknown')
        return {'type': 'BOOKMARK', 'object': {
            'kind': kind, 'apiVersion': f'{group}/{version}' if group else version,
            'metadata': {'resourceVersion': '0'}}}

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        listed = await super()._serve_list(request)
        listed['metadata'] = {'resourceVersion': str(self._revision)}
        return listed

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        if isinstance(exc, kmock.KubernetesError) and exc.status in REASONS:
            exc = attrs.evolve(exc, reason=REASONS[exc.status])
        return await super()._render_error(exc)


VERSIONED = {('coordination.k8s.io', 'leases'), ('', 'configmaps')}


def _is_versioned_write(request: kmock.Request) -> bool:
    resource = request.resource
    if resource is None or request.action not in (kmock.action.CREATE, kmock.action.UPDATE):
        return False
    group = getattr(resource, 'group', None) or ''
    return (group, getattr(resource, 'plural', None)) in VERSIONED


async def serve(port: int, bookmark_every: float) -> None:
    emulator = Emulator(bookmark_every=bookmark_every)
    for resource, info in RESOURCES.items():
        emulator.resources[resource] = info
    async with emulator, kmock.Server(emulator, port=port) as server:
        print(f'listening on http://{server.host}:{server.port}', flush=True)
        await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--port', type=int, default=0, help='0 picks a free port')
    parser.add_argument('--bookmark-every', type=float, default=1.0,
                        help='seconds between bookmarks on a quiet watch')
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.port, args.bookmark_every))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == '__main__':
    main()
