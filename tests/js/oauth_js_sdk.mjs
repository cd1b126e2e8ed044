// matrix-js-sdk 43's OAuth 2.0 client (PR #5390) against this server, as Element Web uses it:
// getAuthMetadata, OAuth2.registerClient (a native client, loopback redirect on a random
// port), generateAuthorizationCodeGrantUrl, the person's sign-in (the driver's part: this
// script prints {"authorize": URL, "user": NAME} and waits for the browser to land on its
// loopback listener), completeAuthorizationCodeGrant, then a MatrixClient that refreshes by
// itself (refreshToken + oauthClientId + onTokenRefresh) and logs out with two revocations.
//
// Mode "flow": one user, the whole life of a session (waits past the access token's lifetime),
// the code in the redirect's fragment (js-sdk's default, as Element Web asks).
// Mode "chat": two users signed in so (the code in the query), then a room and messages both ways, end-to-end
// encrypted with js-sdk's Rust crypto (through Synapse behind nginx, delegation to us).
// Prints one JSON line {"result": facts} last.
// Usage: node oauth_js_sdk.mjs flow <base url> <user> <access token lifetime s>
//        node oauth_js_sdk.mjs chat <base url> <user a> <user b> <access token lifetime s>
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";
import http from "node:http";
import readline from "node:readline";

logger.disableAll();
// matrix-js-sdk 43 wants Node 22; Promise.withResolvers is what Node 20 lacks (chat.mjs).
Promise.withResolvers ??= function withResolvers() {
  let resolve, reject;
  const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
  return { promise, resolve, reject };
};
const mode = process.argv[2];
const base = process.argv[3];
const users = mode === "chat" ? process.argv.slice(4, 6) : [process.argv[4]];
const lifetime = Number(process.argv[mode === "chat" ? 6 : 5]);
const out = {};
const say = (line) => console.log(JSON.stringify(line));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Every request js-sdk makes, to count the OAuth ones (its OAuth2 class uses global fetch).
const requests = [];
const realFetch = globalThis.fetch;
globalThis.fetch = (resource, options) => {
  requests.push([options?.method ?? "GET", String(resource instanceof Request ? resource.url : resource)]);
  return realFetch(resource, options);
};
const countTo = (url) => requests.filter(([method, u]) => method === "POST" && u === url).length;

// The URL the browser landed on, from the driver (a fragment never reaches the listener).
const landedUrls = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

// The loopback redirect (RFC 8252 7.3).
const callbacks = [];
const server = http.createServer((req, res) => {
  res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
  res.end("<!DOCTYPE html><title>Signed in</title><p>You can close this window.</p>");
  callbacks.shift()?.(new URL(req.url, `http://127.0.0.1:${server.address().port}`));
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const redirectUri = `http://127.0.0.1:${server.address().port}/callback`;

async function waitFor(what, check, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(200);
  }
}

const errorOf = (e) => [e.httpStatus ?? null, e.errcode ?? e.error ?? e.message];

// Discovery and registration, once per run (a client registers at the start of its flow).
let metadata, clientId;
async function register() {
  metadata = await sdk.createClient({ baseUrl: base }).getAuthMetadata();
  out.metadata = { issuer: metadata.issuer, account_management_uri: metadata.account_management_uri ?? null,
                   grant_types: metadata.grant_types_supported };
  clientId = await sdk.OAuth2.registerClient(metadata, {
    application_type: "native", client_name: "matrix-js-sdk test", client_uri: "https://js-sdk.example.org/",
    redirect_uris: [redirectUri],
  });
  out.client_id = typeof clientId === "string" && clientId.length > 0;
}

/** The code grant for one user; a MatrixClient on its tokens that refreshes by itself.
 * responseMode: "fragment" (js-sdk's default, Element Web's) or "query". */
async function signIn(user, responseMode) {
  const deviceId = "JS" + Math.random().toString(36).slice(2, 10).toUpperCase();
  const oauth = new sdk.OAuth2(metadata, { clientId, deviceId });
  const state = Math.random().toString(36).slice(2);
  const url = await oauth.generateAuthorizationCodeGrantUrl(state, redirectUri, responseMode);
  const landed = new Promise((resolve) => callbacks.push(resolve));
  say({ authorize: url, user });
  const hit = await landed;
  const browser = new URL((await landedUrls.next()).value);
  const params = responseMode === "fragment" ? new URLSearchParams(browser.hash.slice(1)) : hit.searchParams;
  const facts = { state_echoed: params.get("state") === state, device_id: deviceId, response_mode: responseMode,
                  code_in_query: hit.searchParams.has("code") };
  const tokens = await oauth.completeAuthorizationCodeGrant(params.get("code"), redirectUri);
  facts.token = { token_type: tokens.token_type, expires_in: tokens.expires_in, scope: tokens.scope,
                  refresh: typeof tokens.refresh_token === "string" };
  const refreshes = [];
  const bare = sdk.createClient({ baseUrl: base, accessToken: tokens.access_token });
  const me = await bare.whoami();
  const client = sdk.createClient({
    baseUrl: base, userId: me.user_id, deviceId, accessToken: tokens.access_token,
    refreshToken: tokens.refresh_token, oauthClientId: clientId,
    onTokenRefresh: (fresh) => { refreshes.push(fresh); },
  });
  return { client, oauth, facts, refreshes, whoami: [me.user_id, me.device_id], first: tokens };
}

async function flow() {
  const { client, oauth, facts, refreshes, whoami, first } = await signIn(users[0], "fragment");
  Object.assign(out, facts);
  out.whoami = whoami;
  out.devices = (await client.getDevices()).devices.map((d) => d.device_id);
  // Past the access token's lifetime: the server answers M_UNKNOWN_TOKEN (soft logout), and
  // the client refreshes by itself and repeats the request.
  await sleep((lifetime + 1.5) * 1000);
  const stale = sdk.createClient({ baseUrl: base, accessToken: first.access_token });
  try { await stale.whoami(); out.expired = "still valid"; }
  catch (e) { out.expired = [e.httpStatus, e.errcode, e.data?.soft_logout ?? null]; }
  const tokenCalls = countTo(metadata.token_endpoint);
  const again = await client.whoami();
  out.whoami_after_expiry = [again.user_id, again.device_id];
  out.refresh_calls = countTo(metadata.token_endpoint) - tokenCalls;
  out.on_token_refresh = refreshes.length;
  const latest = refreshes.at(-1);
  out.refreshed = latest ? { new_access: latest.accessToken !== first.access_token,
                             new_refresh: latest.refreshToken !== first.refresh_token,
                             expiry: latest.expiry instanceof Date } : null;
  // logout(): two RFC 7009 revocations (access and refresh token), no /logout.
  const revocations = countTo(metadata.revocation_endpoint);
  await client.logout(true);
  out.logout_revocations = countTo(metadata.revocation_endpoint) - revocations;
  out.logout_called_matrix_logout = requests.some(([, u]) => u.includes("/logout"));
  const gone = sdk.createClient({ baseUrl: base, accessToken: latest?.accessToken ?? first.access_token });
  try { await gone.whoami(); out.after_logout = "still valid"; }
  catch (e) { out.after_logout = [e.httpStatus, e.errcode]; }
  try { await oauth.performRefreshTokenGrant(latest?.refreshToken ?? first.refresh_token); out.refresh_after_logout = "accepted"; }
  catch (e) { out.refresh_after_logout = errorOf(e); }
}

function plaintexts(client, roomId) {
  const room = client.getRoom(roomId);
  if (!room) return [];
  return room.getLiveTimeline().getEvents()
    .filter((e) => e.getType() === "m.room.message")
    .map((e) => ({ body: e.getContent().body, wire: e.getWireType(), sender: e.getSender(),
                   failed: e.isDecryptionFailure() }));
}

async function received(client, roomId, body) {
  return waitFor(`${client.getUserId()} to decrypt "${body}"`, async () => {
    const room = client.getRoom(roomId);
    for (const e of room ? room.getLiveTimeline().getEvents() : []) await client.decryptEventIfNeeded(e);
    return plaintexts(client, roomId).find((m) => m.body === body);
  }, 60);
}

async function start(session) {
  const { client } = session;
  await client.initRustCrypto({ useIndexedDB: false });
  const prepared = new Promise((resolve) => client.on(sdk.ClientEvent.Sync, (state) => state === "PREPARED" && resolve()));
  await client.startClient({ initialSyncLimit: 20 });
  await prepared;
  return client;
}

async function chat() {
  const a = await signIn(users[0], "query");
  const b = await signIn(users[1], "query");
  out.whoami = [a.whoami, b.whoami];
  out.state_echoed = a.facts.state_echoed && b.facts.state_echoed;
  const alice = await start(a), bob = await start(b);
  try {
    const aliceId = alice.getUserId(), bobId = bob.getUserId();
    const encryption = { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } };
    const { room_id: roomId } = await alice.createRoom({ name: "oauth", invite: [bobId], initial_state: [encryption] });
    await waitFor("the invite", () => bob.getRoom(roomId)?.getMyMembership() === "invite");
    await bob.joinRoom(roomId);
    await waitFor("bob joined", () => alice.getRoom(roomId)?.getMember(bobId)?.membership === "join");
    out.encrypted_room = await alice.getCrypto().isEncryptionEnabledInRoom(roomId);
    await alice.getCrypto().bootstrapCrossSigning({ authUploadDeviceSigningKeys: (makeRequest) => makeRequest(null) });
    out.cross_signing_ready = await alice.getCrypto().isCrossSigningReady();
    await alice.sendTextMessage(roomId, "first secret");
    out.first = await received(bob, roomId, "first secret");
    await bob.sendTextMessage(roomId, "and back");
    out.reply = await received(alice, roomId, "and back");
    // Past the access tokens' lifetime, through Synapse: both clients refresh by themselves
    // and go on talking.
    await sleep((lifetime + 1.5) * 1000);
    await alice.sendTextMessage(roomId, "after refresh");
    out.after_refresh = await received(bob, roomId, "after refresh");
    out.refreshed = [a.refreshes.length > 0, b.refreshes.length > 0];
    const raw = await alice.createMessagesRequest(roomId, null, 20, sdk.Direction.Backward);
    out.wire_types = [...new Set(raw.chunk.filter((e) => e.sender === aliceId && e.state_key === undefined)
      .map((e) => e.type))];
    out.plaintext_on_server = JSON.stringify(raw.chunk).includes("secret");
    // bob logs out (two revocations at this server): Synapse refuses his token at once.
    const latest = b.refreshes.at(-1)?.accessToken ?? b.first.access_token;
    await bob.logout(true);
    const gone = sdk.createClient({ baseUrl: base, accessToken: latest });
    try { await gone.whoami(); out.after_logout = "still valid"; }
    catch (e) { out.after_logout = [e.httpStatus, e.errcode]; }
    out.alice_still = (await alice.whoami()).user_id;
  } finally {
    alice.stopClient();
    bob.stopClient();
  }
}

try {
  await register();
  await (mode === "chat" ? chat() : flow());
} catch (e) {
  out.failed = { name: e.name, message: e.message, status: e.httpStatus ?? null, errcode: e.errcode ?? null,
                 error: e.error ?? null, cause: e.cause?.message ?? null,
                 // The OAuth requests made so far, the last one the failing one.
                 requests: requests.slice(-4) };
} finally {
  server.close();
}
say({ result: out });
process.exit(0);
