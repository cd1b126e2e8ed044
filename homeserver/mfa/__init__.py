"""Second factors (`[mfa]`, issue 38): authenticator apps (TOTP), passkeys (WebAuthn) and
recovery codes, over the session store's FactorStore (backends/sessions/factors.py) and the
operator's key. No HTTP here: the account page and the sign-in's second step call
`service.SecondFactors`."""
