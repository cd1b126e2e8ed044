// oauth4webapi 3 (a strict, independent RFC client) against this server's OAuth 2.0 API:
// discovery (the Matrix auth_metadata, the OpenID and RFC 8414 well-known documents), dynamic
// registration of a native client with a loopback redirect on a random port, the
// authorization code grant with PKCE S256, the token exchange, refresh and revocation.
// The person's part (the sign-in page) is the driver's: this script prints
// {"authorize": URL, "user": NAME} and waits for the browser to land on its loopback
// listener. Prints one JSON line of facts last.
// Usage: node oauth4webapi_flow.mjs <base url> <user>
import * as oauth from "oauth4webapi";
import http from "node:http";

const [base, user] = process.argv.slice(2);
const insecure = { [oauth.allowInsecureRequests]: true };
const out = {};
const say = (line) => console.log(JSON.stringify(line));

async function attempt(what, promise) {
  try { return await promise; }
  catch (e) { out.errors ??= {}; out.errors[what] = { name: e.name, code: e.code, error: e.error, message: e.message, status: e.status }; return null; }
}

// The loopback redirect: a listener on a random port (RFC 8252 7.3), answering one page.
const callbacks = [];
const server = http.createServer((req, res) => {
  res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
  res.end("<!DOCTYPE html><title>Signed in</title><p>You can close this window.</p>");
  callbacks.shift()?.(new URL(req.url, `http://127.0.0.1:${server.address().port}`));
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const redirectUri = `http://127.0.0.1:${server.address().port}/callback`;
const nextCallback = () => new Promise((resolve) => callbacks.push(resolve));

async function whoami(token) {
  const res = await oauth.protectedResourceRequest(token, "GET", new URL("/_matrix/client/v3/account/whoami", base),
    undefined, undefined, insecure);
  const body = await res.json();
  return res.status === 200 ? [200, body.user_id, body.device_id] : [res.status, body.errcode, body.soft_logout];
}

try {
  // Discovery: the Matrix path first (what a Matrix client asks), processed by
  // oauth4webapi's own checks against the issuer it names; then the OpenID well-known
  // document from that issuer, which must be the same server.
  const issuer = new URL(base.replace(/\/?$/, "/"));
  const matrixRes = await fetch(new URL("/_matrix/client/v1/auth_metadata", base));
  const as = await oauth.processDiscoveryResponse(issuer, matrixRes);
  out.issuer = as.issuer;
  out.endpoints = ["authorization_endpoint", "token_endpoint", "revocation_endpoint", "registration_endpoint"]
    .filter((k) => typeof as[k] === "string");
  out.code_challenge_methods = as.code_challenge_methods_supported;
  const wellKnown = await attempt("discovery_oidc", oauth.discoveryRequest(issuer, { ...insecure, algorithm: "oidc" })
    .then((res) => oauth.processDiscoveryResponse(issuer, res)));
  out.well_known_same = wellKnown !== null && out.endpoints.every((k) => wellKnown[k] === as[k]);
  // And RFC 8414's own well-known path (oauth4webapi's "oauth2" algorithm).
  const rfc8414 = await attempt("discovery_oauth2", oauth.discoveryRequest(issuer, { ...insecure, algorithm: "oauth2" })
    .then((res) => oauth.processDiscoveryResponse(issuer, res)));
  out.rfc8414_same = rfc8414 !== null && out.endpoints.every((k) => rfc8414[k] === as[k]);

  // Dynamic registration (RFC 7591): a public native client.
  const registered = await oauth.dynamicClientRegistrationRequest(as, {
    application_type: "native", client_name: "oauth4webapi test", client_uri: "https://oauth4webapi.example.org/",
    redirect_uris: [redirectUri], grant_types: ["authorization_code", "refresh_token"], response_types: ["code"],
    token_endpoint_auth_method: "none",
  }, insecure);
  out.registration_status = registered.status;
  const client = await oauth.processDynamicClientRegistrationResponse(registered);
  out.client_id = typeof client.client_id === "string" && client.client_id.length > 0;
  const auth = oauth.None();

  // Authorization code + PKCE S256.
  const verifier = oauth.generateRandomCodeVerifier();
  const challenge = await oauth.calculatePKCECodeChallenge(verifier);
  const state = oauth.generateRandomState();
  const deviceId = "O4W" + Math.random().toString(36).slice(2, 9).toUpperCase();
  const url = new URL(as.authorization_endpoint);
  for (const [k, v] of Object.entries({
    response_type: "code", response_mode: "query", client_id: client.client_id, redirect_uri: redirectUri,
    scope: `urn:matrix:client:api:* urn:matrix:client:device:${deviceId}`, state,
    code_challenge_method: "S256", code_challenge: challenge,
  })) url.searchParams.set(k, v);
  const landed = nextCallback();
  say({ authorize: url.href, user });
  const callback = await landed;
  const params = oauth.validateAuthResponse(as, client, callback, state);
  const codeRes = await oauth.authorizationCodeGrantRequest(as, client, auth, params, redirectUri, verifier, insecure);
  const tokens = await oauth.processAuthorizationCodeResponse(as, client, codeRes);
  out.token = { token_type: tokens.token_type, expires_in: tokens.expires_in, scope: tokens.scope,
                refresh: typeof tokens.refresh_token === "string" };
  out.device_id = deviceId;
  out.whoami = await whoami(tokens.access_token);

  // Refresh: a new pair, the new access token works.
  const refreshed = await oauth.processRefreshTokenResponse(as, client,
    await oauth.refreshTokenGrantRequest(as, client, auth, tokens.refresh_token, insecure));
  out.refresh = { rotated: refreshed.refresh_token !== tokens.refresh_token,
                  new_access: refreshed.access_token !== tokens.access_token, expires_in: refreshed.expires_in };
  out.whoami_refreshed = await whoami(refreshed.access_token);

  // Revocation (RFC 7009) of the refresh token ends the session; an unknown token is 200.
  await oauth.processRevocationResponse(
    await oauth.revocationRequest(as, client, auth, refreshed.refresh_token, { ...insecure,
      additionalParameters: { token_type_hint: "refresh_token" } }));
  out.revoked = true;
  out.whoami_after_revoke = await whoami(refreshed.access_token);
  const after = await attempt("refresh_after_revoke", oauth.refreshTokenGrantRequest(as, client, auth,
    refreshed.refresh_token, insecure).then((res) => oauth.processRefreshTokenResponse(as, client, res)));
  out.refresh_after_revoke = after === null ? out.errors.refresh_after_revoke.error : "accepted";
  const unknown = await oauth.revocationRequest(as, client, auth, "not-a-token-we-ever-had", insecure);
  out.revoke_unknown = unknown.status;
  // The code again: used once only (after the revocation, so that what the
  // server ends on a second use is already ended).
  const againRes = await oauth.authorizationCodeGrantRequest(as, client, auth, params, redirectUri, verifier, insecure);
  const again = await attempt("code_again", oauth.processAuthorizationCodeResponse(as, client, againRes));
  out.code_again = again === null ? out.errors.code_again.error : "accepted";

} catch (e) {
  out.failed = { name: e.name, code: e.code, error: e.error, message: e.message, status: e.status,
                 cause: e.cause?.message ?? (typeof e.cause === "object" ? JSON.stringify(e.cause) : e.cause) };
} finally {
  server.close();
}
say({ result: out });
process.exit(0);
