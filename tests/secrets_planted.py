"""Planted secrets: the kinds issue 12 found written verbatim, each with the part that must
never appear in a file, an error or an event once masked."""

from __future__ import annotations

#: kind -> (text as a user would paste it, the secret part that must not survive)
PLANTED: dict[str, tuple[str, str]] = {
    "sk-proj": ("sk-proj-Ab3dEfGhIjKlMnOpQrStUvWxYz0123456789abcd",
                "Ab3dEfGhIjKlMnOpQrStUvWxYz0123456789"),
    "sk-ant": ("sk-ant-api03-Zz9yXwVuTsRqPoNmLkJiHgFeDcBa0123456789-AbCdEf",
               "Zz9yXwVuTsRqPoNmLkJiHgFeDcBa0123456789"),
    "AKIA": ("AKIAIOSFODNN7EXAMPLQ", "IOSFODNN7EXAMPLQ"),
    "aws-secret": ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                   "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    "jwt-bearer": ("Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
                   "eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
                   "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    "ghp": ("ghp_0123456789abcdefghijABCDEFGHIJ012345", "0123456789abcdefghijABCDEFGHIJ"),
    "hf": ("hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "AbCdEfGhIjKlMnOpQrStUvWxYz0123"),
    "AIza": ("AIzaSyB-0123456789abcdefghijklmnopqrstu", "0123456789abcdefghijklmnopqrstu"),
    "url-password": ("postgres://admin:S3cretPassw0rd-91@db.internal:5432/app",
                     "S3cretPassw0rd-91"),
    "key-query": ("https://maps.example.com/api/geocode?address=x&key=Qz7Rk2Lm9Np4Ws8Xv1Yt6",
                  "Qz7Rk2Lm9Np4Ws8Xv1Yt6"),
    "pem": ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
            "QyNTUxOQAAACDx7Zq9AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n"
            "-----END OPENSSH PRIVATE KEY-----",
            "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"),
    "xoxb": ("xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
             "AbCdEfGhIjKlMnOpQrStUvWx"),
    "PASSWORD=": ("DB_PASSWORD=hunter2-Xyzzy-42", "hunter2-Xyzzy-42"),
}
