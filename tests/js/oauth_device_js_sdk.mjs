// matrix-js-sdk 43's device authorization grant (RFC 8628, v1.18) against this server:
// getAuthMetadata, OAuth2.registerClient (which adds the device grant when the server lists
// it), startDeviceAuthorizationGrant / waitForDeviceAuthorizationGrant, the tokens used,
// refreshed and revoked. The person's part is the driver's: this script prints
// {"verify": URL, "user_code": CODE, "user": NAME, "allow": true|false} and keeps polling
// while the driver's browser answers on our page. Prints {"result": facts} last.
// Usage: node oauth_device_js_sdk.mjs <base url> <user> [expire]
import * as sdk from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";

logger.disableAll();
// matrix-js-sdk 43 wants Node 22; Promise.withResolvers is what Node 20 lacks.
Promise.withResolvers ??= function withResolvers() {
  let resolve, reject;
  const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
  return { promise, resolve, reject };
};
const [base, user, expire] = process.argv.slice(2);
const out = {};
const say = (line) => console.log(JSON.stringify(line));
const errorOf = (e) => [e.httpStatus ?? null, e.errcode ?? e.error ?? e.message];
const randomId = (prefix) => prefix + Math.random().toString(36).slice(2, 9).toUpperCase();

try {
  const metadata = await sdk.createClient({ baseUrl: base }).getAuthMetadata();
  out.metadata = { device_authorization_endpoint: metadata.device_authorization_endpoint ?? null,
                   grant_types: metadata.grant_types_supported };
  const clientId = await sdk.OAuth2.registerClient(metadata, {
    application_type: "native", client_name: "matrix-js-sdk device test", client_uri: "https://js-sdk.example.org/",
    redirect_uris: ["http://127.0.0.1/callback"],
  });

  if (expire) {
    // Nobody answers: the client polls past its own deadline, so the server's answer shows.
    const oauth = new sdk.OAuth2(metadata, { clientId, deviceId: randomId("JSEXP") });
    const session = await oauth.startDeviceAuthorizationGrant();
    out.expires_in = session.expires_in;
    const started = Date.now();
    out.expired = (await oauth.waitForDeviceAuthorizationGrant({ ...session, expires_in: session.expires_in + 30 })).error
      ?? "granted";
    out.expired_after = (Date.now() - started) / 1000;
  } else {
    // Allowed, the code typed on verification_uri.
    const deviceId = randomId("JSDEV");
    const oauth = new sdk.OAuth2(metadata, { clientId, deviceId });
    const session = await oauth.startDeviceAuthorizationGrant();
    out.session = { user_code: session.user_code, interval: session.interval, expires_in: session.expires_in,
                    verification_uri: session.verification_uri, complete: session.verification_uri_complete };
    say({ verify: session.verification_uri, user_code: session.user_code, user, allow: true });
    const tokens = await oauth.waitForDeviceAuthorizationGrant(session);
    out.allowed = { error: tokens.error ?? null, token_type: tokens.token_type, scope: tokens.scope,
                    refresh: typeof tokens.refresh_token === "string", device_id: deviceId };
    const me = await sdk.createClient({ baseUrl: base, accessToken: tokens.access_token }).whoami();
    out.whoami = [me.user_id, me.device_id];
    const refreshed = await oauth.performRefreshTokenGrant(tokens.refresh_token);
    out.refreshed = typeof refreshed.access_token === "string" && refreshed.access_token !== tokens.access_token;
    await oauth.revokeToken(refreshed.refresh_token, "refresh_token");
    try { await sdk.createClient({ baseUrl: base, accessToken: refreshed.access_token }).whoami(); out.after_revoke = "still valid"; }
    catch (e) { out.after_revoke = errorOf(e); }

    // Denied, from verification_uri_complete (no code typed).
    const denied = new sdk.OAuth2(metadata, { clientId, deviceId: randomId("JSDENY") });
    const second = await denied.startDeviceAuthorizationGrant();
    say({ verify: second.verification_uri_complete, user_code: second.user_code, user, allow: false });
    out.denied = (await denied.waitForDeviceAuthorizationGrant(second)).error ?? "granted";
  }
} catch (e) {
  out.failed = { name: e.name, message: e.message, stack: e.stack?.split("\n").slice(0, 5) };
}
say({ result: out });
process.exit(0);
