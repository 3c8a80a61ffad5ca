"""Which of the operator's environment variables hold a secret (a token, a key, a password), by name or by value:
no process the judge starts gets them, a rank least of all (boundary.rank_environ). Kept apart from boundary.py, a
list of patterns each red team has added to, so that each of the two stays readable in one sitting."""
from __future__ import annotations

import re


# Variables whose names say they hold a secret of the operator's (a token, a key, a password): no process the judge
# starts gets them, a rank least of all (red team 35: RT35_OPERATOR_TOKEN, exported by the operator, was in every
# rank's environment). PWD alone is the shell's working folder. Red team 46: a personal access token (GITHUB_PAT)
# and a TOTP seed; NCCL_PAT_* are the knobs of NCCL's PAT algorithm.
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASS($|_|WORD|WD|PHRASE|CODE)|CRED|AUTH|COOKIE|PRIVATE|SIGNING"
                         r"|(^|_)[A-Z]*KEY[A-Z0-9]*($|_)|API_?KEY|ACCESS_?KEY|CONNECTION_?STRING|^AWS_|^SSH_AUTH_SOCK$"
                         r"|(^|_)(PW|PSK|TOK|OTP|TOTP|MFA)($|_)|(^|(?<!NCCL)_)PAT($|_)|OTP_?SEED"
                         r"|_PWD($|_)|^PWD_|JWT|BEARER|HMAC|SESSION_?ID", re.IGNORECASE)
# ... and values that carry one whatever their name: anything before an '@' in a URL (red team 37:
# redis://:password@host; red team 38: a bare token, https://ghp_...@github.com, and a password holding '/'; red
# team 39: one holding a space), a credential in a query or a JSON key (red team 38: an Azure SAS's sig=, an S3
# presigned X-Amz-Signature=; red team 39: pass=, api-key=), a connection string's key or password, a private key,
# an Authorization header's value, and the token formats that say what they are (a whole word: a folder named
# sk-... in a PATH is none; red team 41: npm, Vault, Doppler, Atlassian, Twilio, Telegram, Discord and more, a
# netrc line and curl's -u user:password; red team 43: a Discord webhook, docker's "auth" and mysql's -p<password>; red team 44: the
# password options of sshpass, redis-cli, openssl, smbclient and ldap*, and Postman's keys; a config's line, YAML's
# `password: x` or TOML's `token = "x"`, red team 45 left open; red team 47: passphrase, private_key, api_token,
# credentials and curl's --user).
SECRET_VALUE = re.compile(
    r"://[^\s@]*@|://[^/@]*@|(^|[\s=])[^\s:/@]+:[^\s/@]+@[A-Za-z0-9-]+[.:]"
    r"|[?&;#](sig|signature|x-(amz|goog)-[a-z-]*|[a-z_-]*token|[a-z_-]*key(id)?|secret|"
    r"client_secret|pass|password|passwd|pwd|auth|code)=|[\"'][a-z_-]*(token|secret|password|passwd|key|auth)[\"']\s*:"
    r"|(AccountKey|SharedAccessSignature|password|pwd)=|PRIVATE KEY|\b(Bearer|Basic|Token)\s+[A-Za-z0-9+/=._~-]{8,}"
    r"|\bya29\.[A-Za-z0-9_-]{16,}|\bdapi[0-9a-f]{32}\b"
    r"|hooks\.slack\.com/services/|discord(app)?\.com/api/webhooks/|(^|[\s;|&])(mysql|mysqldump|mysqladmin|mariadb)\s(.*\s)?-p\S"
    r"|\bsshpass\s+-p\s*\S|\bredis-cli\s(.*\s)?-a\s*\S|-pass(in|out)\s+pass:\S|\bsmbclient\s(.*\s)?-U\s*\S+%\S"
    r"|\bldap[a-z]*\s(.*\s)?-w\s*\S|\bPMAK-[A-Za-z0-9-]{20,}"
    r"|(^|[\s=\"':,;@])(ghp|gho|ghu|ghs|ghr|github_pat|glpat|hf|sk|npm|pypi|dckr_pat"
    r"|[rsp]k_(live|test)|xox[abpr]|dop_v1|shp(at|ss|ca|pa)|lin_api|r8|gsk|pplx|glsa|secret)[_-][A-Za-z0-9_-]{16,}"
    r"($|[\s\"',;:@.])|\b(AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{30,}|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\."
    r"|(?-i:\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{32,})"
    r"|AGE-SECRET-KEY-|\bhvs\.[A-Za-z0-9_-]{20,}|\bdp\.[a-z]{2,5}\.[A-Za-z0-9._-]{16,}|\bATATT[A-Za-z0-9_=-]{20,}"
    r"|\bSK[0-9a-f]{32}\b|\b[0-9]{8,10}:AA[A-Za-z0-9_-]{30,}|_authToken=|\bpassword\s+\S+|(^|\s)-u\s*[^\s:]+:\S+"
    r"|\b[MN][A-Za-z0-9]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,}"
    r"|(^|[\s{,;])[\"']?(pass|password|passwd|passphrase|pw|pwd|secret|token|credentials?|private[_-]?key"
    r"|api[_-]?(key|token)|secret[_-]?key|access[_-]?(key|token)|client[_-]?secret|auth[_-]?token)[\"']?"
    r"(:\s+|\s*=\s*)\S|(^|\s)--user[=\s]+[^\s:]+:\S", re.IGNORECASE)


# Knobs whose names hold KEY but whose values are no secret (red team 40: an IB partition, a cache key's tag, a key's
# format). Their values are still checked.
KNOBS_NAMED_LIKE_SECRETS = frozenset({"TORCH_COMPILE_CACHE_KEY_TAG", "TORCH_COMPILE_STICKY_PGO_KEY",
                                      "TRITON_REDIS_KEY_FORMAT", "NCCL_IB_PKEY", "UCX_IB_PKEY"})
# A bare key: a word of 32 or more base64 characters (url-safe too) with letters of both cases beyond hex digits, and
# a digit (red team 39: an AWS secret access key has no prefix to tell it by; red team 42: a url-safe one). GPU UUIDs,
# hex hashes and the values of variables named for paths (a relative PYTHONPATH entry) are none.
_WORD = re.compile(r"[^\s=:,;\"'()\[\]{}]+")
_BARE_KEY = re.compile(r"[A-Za-z0-9+/_-]{32,}={0,2}")
_NAMED_FOR_PATHS = re.compile(r"(PATH|DIRS?|DIRECTORY|HOME|ROOT|PREFIX|FILE|EXE|LIB|LIBS|TRACE)$", re.IGNORECASE)


def _bare_key(value: str) -> bool:
    for word in _WORD.findall(value):
        if (not word.startswith("/") and _BARE_KEY.fullmatch(word) and any(c.isdigit() for c in word)
                and not ("/" in word and ("_" in word or "-" in word))  # a relative path: no key mixes base64's
                # '/' with url-safe base64's '_' or '-' (red team 47: runs/TraceOfV9_Experts8 was withheld)
                and sum(c in "ghijklmnopqrstuvwxyz" for c in word) >= 2
                and sum(c in "GHIJKLMNOPQRSTUVWXYZ" for c in word) >= 2):
            return True
    return False


def is_secret(name: str, value: str) -> bool:
    named = SECRET_NAME.search(name) and name.upper() not in KNOBS_NAMED_LIKE_SECRETS
    return bool(named or SECRET_VALUE.search(value) or (not _NAMED_FOR_PATHS.search(name) and _bare_key(value)))
