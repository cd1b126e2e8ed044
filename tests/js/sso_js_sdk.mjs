// matrix-js-sdk 43's legacy SSO login (MSC3824's "OAuth 2.0 aware clients" path, as Cinny and
// Element Web before OAuth use it): loginFlows, getSsoLoginUrl (with action=login) to a loopback
// listener, the person's browser sign-in (the driver's part: this script prints
// {"authorize": URL, "user": NAME} and waits for the browser to land on its listener), then
// loginWithToken with the loginToken the browser brought back.
//
// Mode "login": one user; the token works once (a second loginWithToken / login("m.login.token")
// is refused), whoami, the device and its display name.
// Mode "chat": two users signed in so, a room, a message each way read back from sync
// (through Synapse behind nginx, delegation to us).
// Prints one JSON line {"result": facts} last.
// Usage: node sso_js_sdk.mjs login <base url> <user>
//        node sso_js_sdk.mjs chat <base url> <user a> <user b>
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
const [mode, base, ...users] = process.argv.slice(2);
const out = {};
const say = (line) => console.log(JSON.stringify(line));
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const errorOf = (e) => [e.httpStatus ?? null, e.errcode ?? e.message];

// The URL the browser landed on, from the driver, once it is there (the driver writes it to
// stdin: read, so that it never writes to a script that has ended).
const landedUrls = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

// Where the browser comes back: a loopback listener, with a query of the client's own.
const callbacks = [];
const server = http.createServer((req, res) => {
  res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
  res.end("<!DOCTYPE html><title>Signed in</title><p>You can close this window.</p>");
  callbacks.shift()?.(new URL(req.url, `http://127.0.0.1:${server.address().port}`));
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const redirectUrl = `http://127.0.0.1:${server.address().port}/sso-callback?client=js-sdk`;

async function waitFor(what, check, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(200);
  }
}

/** What a legacy client asks first: the flows, and which identity provider to name. */
async function flows() {
  const listed = (await sdk.createClient({ baseUrl: base }).loginFlows()).flows;
  out.flows = listed.map((f) => f.type);
  const sso = listed.find((f) => f.type === "m.login.sso");
  out.sso = sso ? { idps: (sso.identity_providers ?? []).map((p) => p.id),
                    oauth_aware_preferred: sso.oauth_aware_preferred ?? null,
                    unstable: sso["org.matrix.msc3824.delegated_oidc_compatibility"] ?? null } : null;
  return sso?.identity_providers?.[0]?.id;
}

/** One user's browser sign-in and token login; a MatrixClient on the session. */
async function signIn(user, idpId) {
  const bare = sdk.createClient({ baseUrl: base });
  const url = bare.getSsoLoginUrl(redirectUrl, "sso", idpId, "login");
  const landed = new Promise((resolve) => callbacks.push(resolve));
  say({ authorize: url, user });
  const hit = await landed;
  const browser = new URL((await landedUrls.next()).value);
  const token = hit.searchParams.get("loginToken");
  const facts = { own_query_kept: hit.searchParams.get("client") === "js-sdk", token_in_query: Boolean(token),
                  url_action: new URL(url).searchParams.get("action"),
                  browser_landed_there: browser.searchParams.get("loginToken") === token };
  const answer = await bare.loginWithToken(token);
  facts.response_keys = Object.keys(answer).sort();
  // The token again, as loginWithToken and as login("m.login.token", ...): refused.
  const again = sdk.createClient({ baseUrl: base });
  try { await again.loginWithToken(token); facts.second_use = "accepted"; }
  catch (e) { facts.second_use = errorOf(e); }
  try { await again.login("m.login.token", { token }); facts.third_use = "accepted"; }
  catch (e) { facts.third_use = errorOf(e); }
  const client = sdk.createClient({
    baseUrl: base, accessToken: answer.access_token, userId: answer.user_id, deviceId: answer.device_id,
  });
  const me = await client.whoami();
  facts.whoami = [me.user_id, me.device_id];
  facts.device_matches = me.device_id === answer.device_id;
  return { client, facts };
}

async function login() {
  const idp = await flows();
  const { client, facts } = await signIn(users[0], idp);
  Object.assign(out, facts);
  out.devices = (await client.getDevices()).devices.map((d) => d.device_id);
  await client.logout(true);
  try { await client.whoami(); out.after_logout = "still valid"; }
  catch (e) { out.after_logout = errorOf(e); }
}

function messages(client, roomId) {
  const room = client.getRoom(roomId);
  if (!room) return [];
  return room.getLiveTimeline().getEvents()
    .filter((e) => e.getType() === "m.room.message")
    .map((e) => ({ body: e.getContent().body, sender: e.getSender() }));
}

async function start(client) {
  const prepared = new Promise((resolve) => client.on(sdk.ClientEvent.Sync, (state) => state === "PREPARED" && resolve()));
  await client.startClient({ initialSyncLimit: 20 });
  await prepared;
  return client;
}

async function chat() {
  const idp = await flows();
  const a = await signIn(users[0], idp);
  const b = await signIn(users[1], idp);
  out.whoami = [a.facts.whoami, b.facts.whoami];
  out.second_use = [a.facts.second_use, b.facts.second_use];
  const alice = await start(a.client), bob = await start(b.client);
  try {
    const bobId = bob.getUserId();
    const { room_id: roomId } = await alice.createRoom({ name: "legacy sso", invite: [bobId] });
    await waitFor("the invite", () => bob.getRoom(roomId)?.getMyMembership() === "invite");
    await bob.joinRoom(roomId);
    await waitFor("bob joined", () => alice.getRoom(roomId)?.getMember(bobId)?.membership === "join");
    await alice.sendTextMessage(roomId, "hello from a legacy client");
    out.first = await waitFor("the first message", () =>
      messages(bob, roomId).find((m) => m.body === "hello from a legacy client"));
    await bob.sendTextMessage(roomId, "and back");
    out.reply = await waitFor("the reply", () => messages(alice, roomId).find((m) => m.body === "and back"));
  } finally {
    alice.stopClient();
    bob.stopClient();
  }
}

try {
  await (mode === "chat" ? chat() : login());
} catch (e) {
  out.failed = { name: e.name, message: e.message, status: e.httpStatus ?? null, errcode: e.errcode ?? null };
} finally {
  server.close();
}
say({ result: out });
process.exit(0);
